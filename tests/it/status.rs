//! stub_status (nginx's exact text) and tern_metrics (Prometheus text
//! format, checked by a strict parser written here).
use std::collections::{HashMap, HashSet};
use std::io::Write;

use crate::harness::*;

const CONF: &str = "
http {
    server {
        listen 127.0.0.1:@PORT@;
        root html;
        location = /status { stub_status; }
        location = /metrics { tern_metrics; }
    }
}";

/// The numbers of a stub_status page, checked against nginx's layout.
#[derive(Debug, PartialEq, Eq)]
struct Status {
    active: u64,
    accepts: u64,
    handled: u64,
    requests: u64,
    reading: u64,
    writing: u64,
    waiting: u64,
}

fn parse_status(body: &str) -> Status {
    let lines: Vec<&str> = body.split('\n').collect();
    assert_eq!(lines.len(), 5, "{:?}", body);
    assert_eq!(lines[4], "", "ends with a newline");
    let num = |s: &str| -> u64 {
        s.parse()
            .unwrap_or_else(|_| panic!("number: {:?} in {:?}", s, body))
    };
    let active = lines[0]
        .strip_prefix("Active connections: ")
        .and_then(|s| s.strip_suffix(' '))
        .unwrap_or_else(|| panic!("line 1: {:?}", lines[0]));
    assert_eq!(lines[1], "server accepts handled requests");
    let nums: Vec<u64> = lines[2]
        .strip_prefix(' ')
        .and_then(|s| s.strip_suffix(' '))
        .unwrap_or_else(|| panic!("line 3: {:?}", lines[2]))
        .split(' ')
        .map(num)
        .collect();
    assert_eq!(nums.len(), 3);
    let rww: Vec<&str> = lines[3].split(' ').collect();
    assert_eq!(rww.len(), 7, "{:?}", lines[3]);
    assert_eq!(
        (rww[0], rww[2], rww[4], rww[6]),
        ("Reading:", "Writing:", "Waiting:", "")
    );
    Status {
        active: num(active),
        accepts: nums[0],
        handled: nums[1],
        requests: nums[2],
        reading: num(rww[1]),
        writing: num(rww[3]),
        waiting: num(rww[5]),
    }
}

#[test]
fn stub_status_text_and_counts_follow_known_traffic() {
    let p = Prefix::new();
    p.write("html/a", "A");
    let s = Server::start_in(p, CONF);
    // The first request on a fresh server sees itself (as nginx); the
    // harness's readiness probe was one connection without a request.
    let r = s.get("/status");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("Content-Type"), Some("text/plain"));
    assert_eq!(
        r.body_str(),
        "Active connections: 1 \nserver accepts handled requests\n 2 2 1 \nReading: 0 Writing: 1 Waiting: 0 \n"
    );
    assert_eq!(r.header("Content-Length"), Some("97"));
    // Known traffic: 3 requests on one kept-alive connection, closed,
    // then 2 connection-close requests: +3 connections, +5 requests (+1
    // for the asking request and its connection).
    let before = parse_status(&r.body_str());
    let mut ka = s.connect();
    for _ in 0..3 {
        ka.write_all(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
            .expect("write");
        assert_eq!(read_response(&mut ka).expect("resp").status, 200);
    }
    drop(ka);
    assert_eq!(s.get("/a").status, 200);
    assert_eq!(s.get("/nope").status, 404);
    let mut st = None;
    eventually(5, "closed connections gone", || {
        let v = parse_status(&s.get("/status").body_str());
        let ok = v.active == 1;
        st = Some(v);
        ok
    });
    let st = st.expect("status");
    let polls = st.accepts - before.accepts - 3;
    assert!(polls >= 1, "{:?}", st);
    assert_eq!(st.handled, st.accepts, "{:?}", st);
    assert_eq!(
        st.requests - before.requests,
        5 + polls,
        "{:?} {:?}",
        before,
        st
    );
    assert_eq!((st.reading, st.writing, st.waiting), (0, 1, 0), "{:?}", st);
    // HEAD gets the head only; other methods 405.
    let head = s.raw(b"HEAD /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let hr = Resp::parse(&head).expect("head");
    assert_eq!((hr.status, hr.body.len()), (200, 0));
    assert_eq!(hr.header("Content-Length"), Some("97"));
    let post = Resp::parse(&s.raw(
        b"POST /status HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    ))
    .expect("post");
    assert_eq!(post.status, 405);
}

/// One sample of an exposition.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

/// A strict parser of the Prometheus text format 0.0.4: every sample
/// belongs to a family announced by `# TYPE` (with `# HELP` first), names
/// and label names are valid, label values are properly escaped, values
/// parse as floats, no series appears twice, no family is split.
fn parse_prometheus(text: &str) -> Result<(HashMap<String, String>, Vec<Sample>), String> {
    fn valid_name(n: &str, colon: bool) -> bool {
        let mut cs = n.chars();
        let first_ok = |c: char| c.is_ascii_alphabetic() || c == '_' || (colon && c == ':');
        matches!(cs.next(), Some(c) if first_ok(c))
            && cs.all(|c| c.is_ascii_alphanumeric() || c == '_' || (colon && c == ':'))
    }
    if !text.ends_with('\n') {
        return Err("no final newline".into());
    }
    let mut types: HashMap<String, String> = HashMap::new();
    let mut helped: HashSet<String> = HashSet::new();
    let mut done_families: HashSet<String> = HashSet::new();
    let mut current: Option<String> = None;
    let mut seen: HashSet<String> = HashSet::new();
    let mut samples = Vec::new();
    for (ln, line) in text.lines().enumerate() {
        let err = |m: &str| Err(format!("line {}: {}: {:?}", ln + 1, m, line));
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, _) = rest.split_once(' ').unwrap_or((rest, ""));
            if !valid_name(name, true) || !helped.insert(name.to_string()) {
                return err("bad or repeated HELP");
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let Some((name, kind)) = rest.split_once(' ') else {
                return err("TYPE");
            };
            if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                return err("unknown type");
            }
            if types.insert(name.to_string(), kind.to_string()).is_some() {
                return err("TYPE repeated");
            }
            if !helped.contains(name) {
                return err("TYPE before HELP");
            }
            if let Some(c) = current.replace(name.to_string()) {
                done_families.insert(c);
            }
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            return err("unexpected comment or blank line");
        }
        let (series, value) = line.rsplit_once(' ').ok_or("no value")?;
        let value: f64 = value
            .parse()
            .map_err(|_| format!("line {}: value {:?}", ln + 1, value))?;
        let (name, labels) = match series.split_once('{') {
            None => (series, Vec::new()),
            Some((name, rest)) => {
                let Some(body) = rest.strip_suffix('}') else {
                    return err("unclosed labels");
                };
                let mut labels = Vec::new();
                let mut chars = body.chars().peekable();
                while chars.peek().is_some() {
                    let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
                    if !valid_name(&key, false) || chars.next() != Some('"') {
                        return err("label name");
                    }
                    let mut val = String::new();
                    loop {
                        match chars.next() {
                            Some('\\') => match chars.next() {
                                Some('\\') => val.push('\\'),
                                Some('"') => val.push('"'),
                                Some('n') => val.push('\n'),
                                _ => return err("bad escape"),
                            },
                            Some('"') => break,
                            Some('\n') | None => return err("unterminated label value"),
                            Some(c) => val.push(c),
                        }
                    }
                    labels.push((key, val));
                    match chars.next() {
                        Some(',') | None => {}
                        _ => return err("label separator"),
                    }
                }
                (name, labels)
            }
        };
        if !valid_name(name, true) {
            return err("metric name");
        }
        if current.as_deref() != Some(name) || done_families.contains(name) {
            return err("sample outside its family's block");
        }
        if types.get(name).map(String::as_str) == Some("counter") && value < 0.0 {
            return err("negative counter");
        }
        if !seen.insert(series.to_string()) {
            return err("series repeated");
        }
        samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    Ok((types, samples))
}

fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|s| {
            s.name == name
                && s.labels.len() == labels.len()
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.iter().any(|(a, b)| a == k && b == v))
        })
        .map(|s| s.value)
}

/// nginx 1.22.1, measured: an idle kept-alive connection and a fresh one
/// that sent nothing are "Waiting"; one with half a head is "Reading" and
/// its request is already counted.
#[test]
fn stub_status_states_match_nginx() {
    let p = Prefix::new();
    p.write("html/a", "A");
    let s = Server::start_in(p, CONF);
    let before = parse_status(&s.get("/status").body_str());
    let mut ka = s.connect();
    ka.write_all(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    assert_eq!(read_response(&mut ka).expect("resp").status, 200);
    let mut half = s.connect();
    half.write_all(b"GET /a HTTP/1.1\r\nHo").expect("write");
    let _fresh = s.connect();
    std::thread::sleep(std::time::Duration::from_millis(100));
    let st = parse_status(&s.get("/status").body_str());
    assert_eq!(st.active, 4, "{:?}", st);
    assert_eq!((st.reading, st.writing, st.waiting), (1, 1, 2), "{:?}", st);
    // ka's request, half's request, and this one.
    assert_eq!(st.requests - before.requests, 3, "{:?}", st);
}

#[test]
fn the_strict_parser_refuses_bad_expositions() {
    let good = "# HELP a x\n# TYPE a counter\na{b=\"c\\\"d\"} 1\n";
    assert!(parse_prometheus(good).is_ok());
    for bad in [
        "a 1\n",
        "# HELP a x\n# TYPE a counter\na 1",
        "# HELP a x\n# TYPE a counter\na{b=\"c} 1\n",
        "# HELP a x\n# TYPE a counter\na 1\na 2\n",
        "# HELP a x\n# TYPE a counter\na x\n",
        "# HELP a x\n# TYPE a counter\na{b=\"\\q\"} 1\n",
        "# HELP a x\n# TYPE a counter\n# HELP b x\n# TYPE b gauge\na 1\n",
    ] {
        assert!(parse_prometheus(bad).is_err(), "{:?}", bad);
    }
}

#[test]
fn metrics_parse_and_match_known_traffic() {
    let p = Prefix::new();
    p.write("html/a", "A");
    let s = Server::start_in(
        p,
        "thread_pool disk threads=2 max_queue=8;
        http {
            limit_req_zone $binary_remote_addr zone=one:1m rate=1r/m;
            server {
                listen 127.0.0.1:@PORT@;
                root html;
                location /a { limit_req zone=one; }
                location = /metrics { tern_metrics; }
            }
        }",
    );
    assert_eq!(s.get("/a").status, 200);
    assert_eq!(s.get("/a").status, 503);
    assert_eq!(s.get("/missing").status, 404);
    let r = s.get("/metrics");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("Content-Type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let text = r.body_str();
    let (types, samples) = parse_prometheus(&text).unwrap_or_else(|e| panic!("{}\n{}", e, text));
    assert_eq!(
        types.get("tern_http_requests_total").map(String::as_str),
        Some("counter")
    );
    assert_eq!(
        types.get("tern_connections").map(String::as_str),
        Some("gauge")
    );
    // 3 requests before, this one counts itself (as stub_status does);
    // one more connection: the harness's readiness probe.
    assert_eq!(value(&samples, "tern_http_requests_total", &[]), Some(4.0));
    assert_eq!(
        value(&samples, "tern_connections_accepted_total", &[]),
        Some(5.0)
    );
    assert_eq!(
        value(&samples, "tern_connections", &[("state", "active")]),
        Some(1.0)
    );
    assert_eq!(
        value(&samples, "tern_connections", &[("state", "writing")]),
        Some(1.0)
    );
    for (res, want) in [("passed", 1.0), ("rejected", 1.0), ("delayed", 0.0)] {
        assert_eq!(
            value(
                &samples,
                "tern_limit_req_requests_total",
                &[("zone", "one"), ("result", res)]
            ),
            Some(want),
            "{}",
            res
        );
    }
    assert_eq!(
        value(&samples, "tern_limit_req_keys", &[("zone", "one")]),
        Some(1.0)
    );
    // The declared pool is listed with its configuration.
    assert_eq!(
        value(&samples, "tern_io_pool_threads", &[("pool", "disk")]),
        Some(2.0)
    );
    assert_eq!(
        value(&samples, "tern_io_pool_max_queue", &[("pool", "disk")]),
        Some(8.0)
    );
    assert!(value(
        &samples,
        "tern_io_pool_overflows_total",
        &[("pool", "disk")]
    )
    .is_some());
    for mode in ["inline", "offloaded", "direct"] {
        assert!(
            value(&samples, "tern_io_reads_total", &[("mode", mode)]).is_some(),
            "{}",
            mode
        );
    }
    assert!(value(&samples, "tern_open_file_cache_hits_total", &[]).is_some());
    // Responses by status class: present for every class; counted once
    // the engine reports responses (record_response).
    for class in ["1xx", "2xx", "3xx", "4xx", "5xx", "other"] {
        assert!(
            value(&samples, "tern_http_responses_total", &[("class", class)]).is_some(),
            "{}",
            class
        );
    }
    let total: f64 = samples
        .iter()
        .filter(|s| s.name == "tern_http_responses_total")
        .map(|s| s.value)
        .sum();
    if total > 0.0 {
        assert_eq!(
            value(&samples, "tern_http_responses_total", &[("class", "2xx")]),
            Some(1.0)
        );
        assert_eq!(
            value(&samples, "tern_http_responses_total", &[("class", "4xx")]),
            Some(1.0)
        );
        assert_eq!(
            value(&samples, "tern_http_responses_total", &[("class", "5xx")]),
            Some(1.0)
        );
    }
}

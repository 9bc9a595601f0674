//! `tern_metrics;`: the Prometheus text exposition format (version 0.0.4)
//! of tern's counters.
//!
//! Every family is written with `# HELP` and `# TYPE`, label values are
//! escaped, and names follow Prometheus conventions (`_total` counters).
//! Sources:
//! - connections and requests: the workers' shared [`Stats`];
//! - responses by status class and bytes sent: [`RESPONSES`], which the
//!   engine bumps once per response with [`record_response`];
//! - the file-I/O layer: [`crate::io::STATS`] and each pool's stats;
//! - open_file_cache: `open_file_cache::STATS`;
//! - the compressed-file cache: `compress_cache::STATS`;
//! - limit_conn / limit_req: the per-zone counters of this configuration.
//!
//! [`Stats`]: crate::core::worker::Stats

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::http::phases::Ctx;

pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Responses by status class and bytes sent, process-wide.
#[derive(Debug)]
pub struct ResponseCounters {
    /// 1xx..5xx; index 0 holds anything outside 100..599 (e.g. 000, 444).
    pub by_class: [AtomicU64; 6],
    /// Bytes written to clients (head and body).
    pub bytes_sent: AtomicU64,
}

pub static RESPONSES: ResponseCounters = ResponseCounters {
    by_class: [const { AtomicU64::new(0) }; 6],
    bytes_sent: AtomicU64::new(0),
};

/// Counts one finished response: for the engine to call after the
/// response is written (before or in the log phase).
pub fn record_response(status: u16, bytes: u64) {
    let class = match status {
        100..=599 => (status / 100) as usize,
        _ => 0,
    };
    RESPONSES.by_class[class].fetch_add(1, Ordering::Relaxed);
    RESPONSES.bytes_sent.fetch_add(bytes, Ordering::Relaxed);
}

/// Builds one exposition document.
struct Out {
    s: String,
}

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.s, "# HELP {} {}", name, help);
        let _ = writeln!(self.s, "# TYPE {} {}", name, kind);
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: u64) {
        self.s.push_str(name);
        if !labels.is_empty() {
            self.s.push('{');
            for (i, (k, val)) in labels.iter().enumerate() {
                if i > 0 {
                    self.s.push(',');
                }
                self.s.push_str(k);
                self.s.push_str("=\"");
                escape(&mut self.s, val);
                self.s.push('"');
            }
            self.s.push('}');
        }
        let _ = writeln!(self.s, " {}", v);
    }

    fn one(&mut self, name: &str, kind: &str, help: &str, v: u64) {
        self.family(name, kind, help);
        self.sample(name, &[], v);
    }
}

/// Label values escape backslash, double quote and newline.
fn escape(s: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
}

pub fn render(cx: &Ctx<'_>) -> Vec<u8> {
    let mut o = Out {
        s: String::with_capacity(4096),
    };
    let c = super::counts(cx);
    o.one(
        "tern_connections_accepted_total",
        "counter",
        "Client connections accepted.",
        c.accepts,
    );
    o.one(
        "tern_connections_handled_total",
        "counter",
        "Client connections handled.",
        c.handled,
    );
    o.family(
        "tern_connections",
        "gauge",
        "Client connections now, by state (active = reading + writing + waiting).",
    );
    for (state, v) in [
        ("active", c.active),
        ("reading", c.reading),
        ("writing", c.writing),
        ("waiting", c.waiting),
    ] {
        o.sample("tern_connections", &[("state", state)], v);
    }
    o.one(
        "tern_http_requests_total",
        "counter",
        "Client requests.",
        c.requests,
    );
    o.family(
        "tern_http_responses_total",
        "counter",
        "Responses sent, by status class.",
    );
    for (i, class) in ["other", "1xx", "2xx", "3xx", "4xx", "5xx"]
        .iter()
        .enumerate()
    {
        let v = RESPONSES.by_class[i].load(Ordering::Relaxed);
        o.sample("tern_http_responses_total", &[("class", class)], v);
    }
    o.one(
        "tern_http_sent_bytes_total",
        "counter",
        "Bytes sent to clients (heads and bodies).",
        RESPONSES.bytes_sent.load(Ordering::Relaxed),
    );

    let io = crate::io::STATS.snapshot();
    /// Name, help, and (mode, value) samples.
    type IoFamily<'a> = (&'a str, &'a str, &'a [(&'a str, u64)]);
    let io_families: [IoFamily; 7] = [
        (
            "tern_io_reads_total",
            "File reads by how they ran: inline on the event loop, offloaded to a thread pool, or with O_DIRECT.",
            &[
                ("inline", io.reads_inline),
                ("offloaded", io.reads_offloaded),
                ("direct", io.reads_direct),
            ],
        ),
        (
            "tern_io_sendfile_total",
            "sendfile() calls: inline (resident data) or after warming the pages in a pool.",
            &[("inline", io.sends_inline), ("warmed", io.sends_warmed)],
        ),
        (
            "tern_io_opens_total",
            "File opens by how they ran (reused: a kept descriptor still names the file).",
            &[
                ("inline", io.opens_inline),
                ("offloaded", io.opens_offloaded),
                ("reused", io.opens_reused),
            ],
        ),
        (
            "tern_io_stats_total",
            "File stats by how they ran.",
            &[("inline", io.stats_inline), ("offloaded", io.stats_offloaded)],
        ),
        (
            "tern_io_writes_total",
            "File writes by how they ran.",
            &[("inline", io.writes_inline), ("offloaded", io.writes_offloaded)],
        ),
        (
            "tern_io_uring_total",
            "io_uring submissions and fallbacks to a pool.",
            &[
                ("submitted", io.uring_submissions),
                ("fallback", io.uring_fallbacks),
            ],
        ),
        (
            "tern_io_cachestat_total",
            "cachestat(2) residency checks, fallbacks when unavailable, and sends that skipped the check (file found resident a moment before).",
            &[
                ("calls", io.cachestat_calls),
                ("fallback", io.cachestat_fallbacks),
                ("memo", io.residency_memo),
            ],
        ),
    ];
    for (name, help, vals) in io_families {
        o.family(name, "counter", help);
        for (mode, v) in vals {
            o.sample(name, &[("mode", mode)], *v);
        }
    }
    o.one(
        "tern_io_overflows_total",
        "counter",
        "Tasks refused because a thread pool queue was full (all pools).",
        io.overflows,
    );

    let pools = cx.shared.pools.load().stats();
    type PoolField = fn(&crate::io::PoolStats) -> u64;
    let pool_families: [(&str, &str, &str, PoolField); 6] = [
        (
            "tern_io_pool_threads",
            "gauge",
            "Threads of the pool.",
            |p| p.threads as u64,
        ),
        (
            "tern_io_pool_max_queue",
            "gauge",
            "The pool's max_queue.",
            |p| p.max_queue as u64,
        ),
        (
            "tern_io_pool_queue_depth",
            "gauge",
            "Tasks waiting in the pool's queue now.",
            |p| p.queued as u64,
        ),
        (
            "tern_io_pool_queue_depth_max",
            "gauge",
            "Highest queue depth seen.",
            |p| p.max_queued as u64,
        ),
        (
            "tern_io_pool_overflows_total",
            "counter",
            "Tasks refused because the queue was full.",
            |p| p.overflows,
        ),
        (
            "tern_io_pool_tasks_total",
            "counter",
            "Tasks the pool completed.",
            |p| p.done,
        ),
    ];
    for (name, kind, help, f) in pool_families {
        o.family(name, kind, help);
        for p in &pools {
            o.sample(name, &[("pool", &p.name)], f(p));
        }
    }

    let ofc = crate::http::modules::open_file_cache::STATS.snapshot();
    o.one(
        "tern_open_file_cache_hits_total",
        "counter",
        "open_file_cache lookups that found an entry.",
        ofc.hits,
    );
    o.one(
        "tern_open_file_cache_misses_total",
        "counter",
        "open_file_cache lookups that did not.",
        ofc.misses,
    );
    o.one(
        "tern_open_file_cache_evictions_total",
        "counter",
        "open_file_cache entries dropped at max.",
        ofc.evictions,
    );

    let cc = &crate::http::modules::compress_cache::STATS;
    for (name, kind, help, v) in [
        (
            "tern_compress_cache_hits_total",
            "counter",
            "Compressed static files served from the compressed-file cache (or after waiting for another request's compression).",
            &cc.hits,
        ),
        (
            "tern_compress_cache_misses_total",
            "counter",
            "Compressed-file cache misses (each one compression on a pool thread).",
            &cc.misses,
        ),
        (
            "tern_compress_cache_evictions_total",
            "counter",
            "Compressed-file cache entries evicted over budget (memory or disk).",
            &cc.evictions,
        ),
        (
            "tern_compress_cache_saved_bytes_total",
            "counter",
            "Bytes of files that cache hits did not compress again.",
            &cc.saved_bytes,
        ),
        (
            "tern_compress_cache_saved_sent_bytes_total",
            "counter",
            "Bytes cache hits did not send (original minus compressed size).",
            &cc.saved_sent_bytes,
        ),
        (
            "tern_compress_cache_spilled_total",
            "counter",
            "Entries written to compress_cache_path after eviction from memory.",
            &cc.spilled,
        ),
        (
            "tern_compress_cache_memory_bytes",
            "gauge",
            "Bytes of compressed files held in memory.",
            &cc.memory_bytes,
        ),
        (
            "tern_compress_cache_disk_bytes",
            "gauge",
            "Bytes of compressed files spilled to compress_cache_path.",
            &cc.disk_bytes,
        ),
    ] {
        o.one(name, kind, help, v.load(Ordering::Relaxed));
    }

    let mods = &cx.http.main.modules;
    let mut conn_zones: Vec<_> = mods.limit_conn.zones.values().collect();
    conn_zones.sort_by(|a, b| a.name.cmp(&b.name));
    o.family(
        "tern_limit_conn_requests_total",
        "counter",
        "limit_conn decisions by zone ($limit_conn_status).",
    );
    for z in &conn_zones {
        let k = &z.state.counters;
        for (res, v) in [
            ("passed", &k.passed),
            ("rejected", &k.rejected),
            ("rejected_dry_run", &k.rejected_dry_run),
        ] {
            o.sample(
                "tern_limit_conn_requests_total",
                &[("zone", &z.name), ("result", res)],
                v.load(Ordering::Relaxed),
            );
        }
    }
    o.family(
        "tern_limit_conn_active",
        "gauge",
        "Requests holding a limit_conn slot now, by zone.",
    );
    for z in &conn_zones {
        o.sample(
            "tern_limit_conn_active",
            &[("zone", &z.name)],
            z.state.in_use(),
        );
    }
    let mut req_zones: Vec<_> = mods.limit_req.zones.values().collect();
    req_zones.sort_by(|a, b| a.name.cmp(&b.name));
    o.family(
        "tern_limit_req_requests_total",
        "counter",
        "limit_req decisions by zone ($limit_req_status).",
    );
    for z in &req_zones {
        let k = &z.state.counters;
        for (res, v) in [
            ("passed", &k.passed),
            ("delayed", &k.delayed),
            ("rejected", &k.rejected),
            ("delayed_dry_run", &k.delayed_dry_run),
            ("rejected_dry_run", &k.rejected_dry_run),
        ] {
            o.sample(
                "tern_limit_req_requests_total",
                &[("zone", &z.name), ("result", res)],
                v.load(Ordering::Relaxed),
            );
        }
    }
    o.family(
        "tern_limit_req_keys",
        "gauge",
        "Keys with a bucket in the zone now.",
    );
    for z in &req_zones {
        o.sample(
            "tern_limit_req_keys",
            &[("zone", &z.name)],
            z.state.keys() as u64,
        );
    }
    o.s.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_escaping() {
        let mut s = String::new();
        escape(&mut s, "a\"b\\c\nd");
        assert_eq!(s, "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn status_classes() {
        let before = RESPONSES.by_class[4].load(Ordering::Relaxed);
        record_response(404, 10);
        record_response(0, 0);
        assert_eq!(RESPONSES.by_class[4].load(Ordering::Relaxed), before + 1);
    }
}

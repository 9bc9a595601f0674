//! What each upstream attempt of a request did, for the `$upstream_*`
//! variables (nginx's `r->upstream_states`, one `ngx_http_upstream_state_t`
//! per peer tried).
//!
//! ```text
//!  States (one per request, shared by the handler, the body's Producer
//!  and the log phase)
//!    [ attempt, attempt, SEPARATOR, attempt ]
//!      └ a Slot per attempt, written as it goes: connected, head, bytes;
//!        its response time set once it ends (failure, next peer, body
//!        read whole, or dropped: the client left)
//!    rendered: "a, b : c" — ", " between the peers of one upstream
//!    use, " : " where an internal redirect (X-Accel-Redirect, error_page)
//!    used an upstream again.
//! ```
//!
//! Times render as nginx's `%T.%03M` (seconds with milliseconds), `-`
//! where the attempt did not get that far (no connection, no head, or,
//! for the response time, not yet ended). Byte counts always render.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::http::phases::Ctx;

/// One attempt (or, without a peer, the mark of an internal redirect).
#[derive(Default, Clone)]
struct UpState {
    peer: Option<String>,
    status: u16,
    connect: Option<Duration>,
    header: Option<Duration>,
    response: Option<Duration>,
    bytes_sent: u64,
    bytes_received: u64,
    response_length: u64,
}

/// A request's attempts.
#[derive(Default)]
pub struct States {
    list: Mutex<Vec<UpState>>,
}

/// The variables rendered from [`States`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Var {
    Addr,
    Status,
    ConnectTime,
    HeaderTime,
    ResponseTime,
    ResponseLength,
    BytesSent,
    BytesReceived,
}

impl Var {
    pub fn of(name: &str) -> Option<Var> {
        Some(match name {
            "upstream_addr" => Var::Addr,
            "upstream_status" => Var::Status,
            "upstream_connect_time" => Var::ConnectTime,
            "upstream_header_time" => Var::HeaderTime,
            "upstream_response_time" => Var::ResponseTime,
            "upstream_response_length" => Var::ResponseLength,
            "upstream_bytes_sent" => Var::BytesSent,
            "upstream_bytes_received" => Var::BytesReceived,
            _ => return None,
        })
    }
}

const MEMO: &str = "upstream_states";

impl States {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<UpState>> {
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The request's states, if an upstream was used.
    pub fn of(cx: &Ctx<'_>) -> Option<Arc<States>> {
        cx.memo
            .borrow()
            .iter()
            .find(|(k, _)| *k == MEMO)
            .and_then(|(_, v)| v.downcast_ref::<Arc<States>>())
            .cloned()
    }

    /// The states for a new use of an upstream by the request: after an
    /// earlier use (an internal redirect), a separator first, as nginx
    /// pushes an empty state in ngx_http_upstream_init_request.
    pub fn begin_use(cx: &Ctx<'_>) -> Arc<States> {
        if let Some(s) = States::of(cx) {
            s.lock().push(UpState::default());
            return s;
        }
        let s = Arc::new(States::default());
        cx.memo.borrow_mut().push((MEMO, Box::new(s.clone())));
        s
    }

    /// A new attempt on `peer`, timed from now.
    pub fn attempt(self: &Arc<Self>, peer: &str) -> Slot {
        let mut l = self.lock();
        l.push(UpState {
            peer: Some(peer.to_string()),
            ..UpState::default()
        });
        Slot {
            states: Some(self.clone()),
            idx: l.len() - 1,
            start: Instant::now(),
        }
    }

    /// The peer of the latest attempt, if one was made.
    pub fn last_peer(&self) -> Option<String> {
        self.lock().last().and_then(|s| s.peer.clone())
    }

    /// Appends the variable's value, as nginx's variable handlers do;
    /// false when no attempt was recorded (the variable is not found).
    pub fn render(&self, var: Var, out: &mut Vec<u8>) -> bool {
        let l = self.lock();
        if l.is_empty() {
            return false;
        }
        let mut i = 0;
        loop {
            let s = &l[i];
            match var {
                Var::Addr => {
                    if let Some(p) = &s.peer {
                        out.extend_from_slice(p.as_bytes());
                    }
                }
                Var::Status => {
                    if s.status != 0 {
                        out.extend_from_slice(s.status.to_string().as_bytes());
                    } else {
                        out.push(b'-');
                    }
                }
                Var::ConnectTime => secs(s.connect, out),
                Var::HeaderTime => secs(s.header, out),
                Var::ResponseTime => secs(s.response, out),
                Var::ResponseLength => num(s.response_length, out),
                Var::BytesSent => num(s.bytes_sent, out),
                Var::BytesReceived => num(s.bytes_received, out),
            }
            i += 1;
            if i == l.len() {
                break;
            }
            if l[i].peer.is_some() {
                out.extend_from_slice(b", ");
            } else {
                out.extend_from_slice(b" : ");
                i += 1;
                if i == l.len() {
                    break;
                }
            }
        }
        true
    }
}

fn num(n: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(n.to_string().as_bytes());
}

/// nginx's `%T.%03M` of a time, `-` when unset.
fn secs(d: Option<Duration>, out: &mut Vec<u8>) {
    match d {
        Some(d) => {
            out.extend_from_slice(format!("{}.{:03}", d.as_secs(), d.subsec_millis()).as_bytes())
        }
        None => out.push(b'-'),
    }
}

/// One attempt's record, written as the attempt goes. Its response time
/// is set when it ends: [`Slot::finish`], or when it is dropped.
pub struct Slot {
    /// None: nothing records (a background cache update).
    states: Option<Arc<States>>,
    idx: usize,
    start: Instant,
}

impl Slot {
    /// A slot that records nothing.
    pub fn none() -> Slot {
        Slot {
            states: None,
            idx: 0,
            start: Instant::now(),
        }
    }

    fn with(&self, f: impl FnOnce(&mut UpState)) {
        if let Some(s) = &self.states {
            if let Some(st) = s.lock().get_mut(self.idx) {
                f(st);
            }
        }
    }

    /// The connection is up (a kept-alive one counts as connected at once).
    pub fn connected(&self) {
        let d = self.start.elapsed();
        self.with(|s| s.connect = Some(d));
    }

    /// The response head is complete.
    pub fn head(&self, status: u16) {
        let d = self.start.elapsed();
        self.with(|s| {
            s.header = Some(d);
            s.status = status;
        });
    }

    pub fn status(&self, status: u16) {
        self.with(|s| s.status = status);
    }

    pub fn sent(&self, n: usize) {
        self.with(|s| s.bytes_sent += n as u64);
    }

    /// Bytes read from the peer.
    pub fn received(&self, n: usize) {
        self.with(|s| s.bytes_received += n as u64);
    }

    /// Bytes of the answer after its head that went to the body (nginx
    /// counts the answer's body only for the attempt that answers; what
    /// came with the head counts as read then).
    pub fn body(&self, n: usize) {
        self.with(|s| s.response_length += n as u64);
    }

    /// The attempt ended: its response time is set (once).
    pub fn finish(&mut self) {
        let d = self.start.elapsed();
        self.with(|s| {
            if s.response.is_none() {
                s.response = Some(d);
            }
        });
    }

    /// Moves the record out, leaving one that records nothing.
    pub fn take(&mut self) -> Slot {
        std::mem::replace(self, Slot::none())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(s: &States, v: Var) -> String {
        let mut out = Vec::new();
        assert!(s.render(v, &mut out));
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn joins_retries_and_redirects_as_nginx() {
        let s = Arc::new(States::default());
        let mut a = s.attempt("127.0.0.1:1");
        a.status(502);
        a.finish();
        let b = s.attempt("127.0.0.1:2");
        b.connected();
        b.head(200);
        b.received(100);
        b.body(40);
        s.lock().push(UpState::default());
        let c = s.attempt("127.0.0.1:3");
        c.status(404);
        assert_eq!(
            render(&s, Var::Addr),
            "127.0.0.1:1, 127.0.0.1:2 : 127.0.0.1:3"
        );
        assert_eq!(render(&s, Var::Status), "502, 200 : 404");
        assert_eq!(render(&s, Var::ResponseLength), "0, 40 : 0");
        assert_eq!(render(&s, Var::BytesReceived), "0, 100 : 0");
        let ht = render(&s, Var::HeaderTime);
        assert!(ht.starts_with("-, 0.0") && ht.ends_with(" : -"), "{ht}");
        // Not ended yet: no response time.
        let rt = render(&s, Var::ResponseTime);
        assert!(rt.starts_with("0.0") && rt.ends_with(", - : -"), "{rt}");
        drop(b);
        let rt = render(&s, Var::ResponseTime);
        assert!(rt.ends_with(" : -") && !rt.contains(", -"), "{rt}");
    }

    #[test]
    fn empty_is_not_found() {
        let s = States::default();
        assert!(!s.render(Var::Addr, &mut Vec::new()));
    }
}

//! Subrequests: a request for another URI run inside a request, as
//! nginx's `ngx_http_subrequest` does (auth_request, mirror, addition).
//!
//! ```text
//! parent Ctx ── Ctx::subrequest(uri, args, method, body) ──> sub Ctx
//!   shares: the client's request (headers, $request_uri, $request_method
//!           of the main request), the connection, the chosen server, the
//!           realip address, the request body once read (not copied), and
//!           the user-variable storage (moved into the sub while it runs,
//!           moved back by [`finish`]: a `set` in the subrequest is seen by
//!           the parent, as in nginx)
//!   own:    $uri/$args, location, captures, module notes ($upstream_*),
//!           the method handlers see (GET unless the caller says otherwise)
//!   run:    phases::run from server rewrite (no realip: it was done),
//!           `internal` locations reachable, error_page applies, no header
//!           filters (nginx's pass a subrequest's response on untouched)
//!   output: the caller's to keep (addition), read (auth_request) or drop
//!           (mirror, auth_request's body)
//! ```
//!
//! Nothing here runs for a request that makes no subrequest: the main
//! request's `Ctx` only carries `sub_depth = 0`.

use std::sync::Arc;

use crate::core::log::Level;
use crate::http::phases::{self, Ctx};
use crate::http::request::Method;
use crate::http::response::Response;

/// How deep subrequests may nest (nginx: `NGX_HTTP_MAX_SUBREQUESTS`,
/// which it counts down from the main request).
pub const MAX_DEPTH: u8 = 50;

impl<'a> Ctx<'a> {
    /// A subrequest for `uri` (and `args`) with this request's client
    /// request, connection and variables. `method` is what its handlers
    /// (and a proxied request) see; `with_body`: the parent's body, if it
    /// has been read, is the subrequest's too. None (logged as nginx does)
    /// when subrequests nest too deep; the caller answers 500.
    pub fn subrequest(
        &self,
        uri: Vec<u8>,
        args: Option<Vec<u8>>,
        method: Method,
        with_body: bool,
    ) -> Option<Ctx<'a>> {
        if self.sub_depth >= MAX_DEPTH {
            self.log(
                Level::Error,
                &format!(
                    "subrequests cycle while processing \"{}\"",
                    String::from_utf8_lossy(&uri)
                ),
            );
            return None;
        }
        let mut sub = Ctx::new(self.http, self.req, self.server, self.conn, self.shared);
        let body = if with_body {
            self.body.as_ref().and_then(|b| b.share())
        } else {
            None
        };
        let vars = self.user_vars.take();
        let from = (self.sub_depth + 1, self.remote);
        prepare(&mut sub, from, uri, args, method, vars, body);
        // One `$request_id` for the client's request and its subrequests
        // (nginx's subrequests share the main request's variables).
        sub.share_request_id(self);
        Some(sub)
    }
}

impl<'a> Ctx<'a> {
    /// A subrequest that runs alongside its parent and its siblings (SSI's
    /// includes): it starts with a copy of the variables (returned too, as
    /// they were), the parent keeps its own, and [`finish_alongside`]
    /// gives back only what the subrequest changed, so siblings that end
    /// in any order do not undo each other's `set`.
    pub fn subrequest_alongside(
        &self,
        uri: Vec<u8>,
        args: Option<Vec<u8>>,
        method: Method,
        with_body: bool,
    ) -> Option<(Ctx<'a>, Vec<Option<Vec<u8>>>)> {
        let sub = self.subrequest(uri, args, method, with_body)?;
        let before = sub.user_vars.borrow().clone();
        self.user_vars.replace(before.clone());
        Some((sub, before))
    }
}

/// What a subrequest takes from its parent (see the module docs); `from`
/// is its depth and the parent's client address.
pub(crate) fn prepare<'a>(
    sub: &mut Ctx<'a>,
    from: (u8, Option<std::net::SocketAddr>),
    uri: Vec<u8>,
    args: Option<Vec<u8>>,
    method: Method,
    vars: Vec<Option<Vec<u8>>>,
    body: Option<crate::http::body::ReqBody<'a>>,
) {
    sub.sub_depth = from.0;
    sub.uri = uri.into();
    sub.args = args.map(Into::into);
    sub.internal = true;
    sub.method = method;
    sub.remote = from.1;
    sub.realip_done = true;
    sub.user_vars = std::cell::RefCell::new(vars);
    sub.body = body;
}

/// Runs a subrequest's phases: its response, error pages applied.
pub async fn run(sub: &mut Ctx<'_>) -> Response {
    // Boxed: a subrequest's phases may make subrequests of their own.
    let resp = Box::pin(phases::run(sub)).await;
    sub.sent.status = resp.status;
    *resp
}

/// Ends a subrequest: the variables go back to the parent, and with
/// `log_subrequest on` its access-log line is written.
pub fn finish(parent: &Ctx<'_>, sub: Ctx<'_>) {
    if sub.loc.core.log_subrequest.unwrap_or(false) {
        crate::http::modules::log_phase(&sub);
    }
    parent.user_vars.replace(sub.user_vars.take());
}

/// Ends a subrequest made by [`Ctx::subrequest_alongside`]: the
/// variables it changed (against `before`) go to the parent, and with
/// `log_subrequest on` its access-log line is written.
pub fn finish_alongside(parent: &Ctx<'_>, sub: Ctx<'_>, before: &[Option<Vec<u8>>]) {
    if sub.loc.core.log_subrequest.unwrap_or(false) {
        crate::http::modules::log_phase(&sub);
    }
    let after = sub.user_vars.take();
    let mut mine = parent.user_vars.borrow_mut();
    for (i, v) in after.into_iter().enumerate() {
        if before.get(i) == Some(&v) || (v.is_none() && i >= before.len()) {
            continue;
        }
        if mine.len() <= i {
            mine.resize(i + 1, None);
        }
        mine[i] = v;
    }
}

/// A subrequest that nobody waits for (mirror): it runs on its own task
/// with copies of what it shares, so the parent's response and the
/// connection's next request do not wait for it. The variables are a copy
/// taken now: what the subrequest sets is not seen by the parent.
pub fn spawn_background(
    parent: &Ctx<'_>,
    uri: Vec<u8>,
    args: Option<Vec<u8>>,
    method: Method,
    with_body: bool,
) {
    if parent.sub_depth >= MAX_DEPTH {
        parent.log(
            Level::Error,
            &format!(
                "subrequests cycle while processing \"{}\"",
                String::from_utf8_lossy(&uri)
            ),
        );
        return;
    }
    let http = parent.http.clone();
    let req = parent.req.clone();
    let server = parent.server.clone();
    let conn = parent.conn.clone();
    let shared = parent.shared.clone();
    let from = (parent.sub_depth + 1, parent.remote);
    let vars = parent.user_vars.borrow().clone();
    let body = if with_body {
        parent.body.as_ref().and_then(|b| b.share())
    } else {
        None
    };
    tokio::task::spawn_local(async move {
        let http: Arc<_> = http;
        let mut sub = Ctx::new(&http, &req, &server, &conn, &shared);
        prepare(&mut sub, from, uri, args, method, vars, body);
        let resp = run(&mut sub).await;
        // The output is not wanted: a streamed body is dropped unread.
        drop(resp);
        if sub.loc.core.log_subrequest.unwrap_or(false) {
            crate::http::modules::log_phase(&sub);
        }
    });
}

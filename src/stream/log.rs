//! `log_format`, `access_log`, `open_log_file_cache` (nginx's
//! ngx_stream_log_module): the log phase of a stream session. The
//! formats, the log files and their buffering (`buffer=`, `gzip`,
//! `flush=`, `if=`) are http's ([`crate::http::modules::access_log`]),
//! compiled against the stream block's variables; stream has no default
//! log, so a server without `access_log` writes none.

use crate::config::registry::{ctx, row, Args};
use crate::config::{ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::modules::access_log::{write_one, ErrCtx, ScriptCtx};
use crate::stream::conf::{ProxyConf, StreamSetter, StreamSpec, SS};
use crate::stream::session::Session;

/// The log module's directives.
pub const DIRECTIVES: &[StreamSpec] = &[
    row!(
        "access_log",
        SS,
        Args::AtLeast(1),
        StreamSetter::Proxy(set_access_log)
    ),
    row!(
        "log_format",
        ctx::STREAM,
        Args::AtLeast(2),
        StreamSetter::Vars(crate::http::modules::access_log::compile_log_format)
    ),
    row!(
        "open_log_file_cache",
        SS,
        Args::Any,
        StreamSetter::Unsupported
    ),
];

/// `access_log PATH [FORMAT [buffer= gzip flush= if=]] | off`: each
/// adds a log to the level's list; `off` leaves it empty (Some(empty)).
fn set_access_log(p: &mut ProxyConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let logs = p.logs.get_or_insert_with(Vec::new);
    if let Some(spec) = crate::http::modules::access_log::parse_access_log(d, cx, false)? {
        logs.push(spec);
    }
    Ok(())
}

/// The log phase: every `access_log` of the session's server.
pub fn log_phase(s: &Session) {
    for l in &s.srv.logs {
        write_one(l, s, &|| ScriptCtx {
            root: Vec::new(),
            cache: None,
            err: ErrCtx {
                logger: s.logger.clone(),
                conn: s.id,
                suffix: format!(" while logging session, {}", s.client_ctx()),
            },
            // The session is over: nothing follows that the line must precede.
            wait: false,
        });
    }
}

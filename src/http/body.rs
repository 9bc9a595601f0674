//! Request bodies, read whole for the handlers that need them
//! (`proxy_pass`), and the `client_body_*` directives this owns.
//!
//! ```text
//! conn::request ── a body is announced ── Ctx::body = ReqBody { connection, read buffer }
//!   phases ── a content handler calls body::read(cx, default temp dir)
//!     `Expect: 100-continue` ── "HTTP/1.1 100 Continue" (only now: the body is wanted)
//!     buffered bytes, then the socket ── Content-Length slice | ChunkedDecoder
//!       ├─ memory while the body fits client_body_buffer_size (HTTP/1:
//!       │  or 1.25 times it when the length says it will fit, as nginx)
//!       └─ beyond (or client_body_in_file_only): a temp file under
//!          client_body_temp_path, written with crate::io::write_at (the
//!          pool with `aio threads` + `aio_write on`); created and unlinked
//!          in one call, so the descriptor is its only reference and a
//!          client that vanishes leaves nothing on disk
//!   conn::request ── body::give_back: the read buffer goes back to the
//!     connection (bytes after the body belong to a pipelined request);
//!     Unread: discarded as before; Broken: the connection closes
//! ```
//!
//! Limits as nginx: `client_max_body_size` (a Content-Length over it is
//! refused when the location is found, in `phases`; a chunked body as soon
//! as a chunk's size line takes it over: 413), `client_body_timeout`
//! between two reads (408, the connection closes without a response, as
//! nginx's terminate does), a client that closes mid-body (400 logged,
//! nothing sent). The body stays readable for the whole request: a retry
//! on the next upstream sends it again from memory or from the file.

use std::future::Future;
use std::io::{self, IoSlice};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::config::registry::{arg, ctx, flag, set_once, Args, Setter, Spec};
use crate::config::{value, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::core::stream::Stream;
use crate::http::conf::{merge_opts, LocConf};
use crate::http::phases::Ctx;
use crate::http::response::Response;
use crate::http::v1::chunked::ChunkedDecoder;
use crate::io::{OpenFile, Policy};

// ---- configuration ----------------------------------------------------------

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "client_body_temp_path",
        ctx: ctx::HSL,
        args: Args::take1234(),
        set: Setter::Loc(set_temp_path),
    },
    Spec {
        name: "client_body_in_file_only",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_file_only),
    },
    Spec {
        name: "client_body_in_single_buffer",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(set_single_buffer),
    },
];

/// `client_body_temp_path DIR [L1 [L2 [L3]]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TempDir {
    pub path: PathBuf,
    /// Subdirectory name lengths, taken from the end of the file name.
    pub levels: Vec<usize>,
}

impl TempDir {
    /// A directory without levels (the default `<prefix>/client_body_temp`).
    /// Registered with the cache keeper so it may create it for the workers.
    pub fn plain(path: PathBuf) -> TempDir {
        crate::cache::allow_dir(&path);
        TempDir {
            path,
            levels: Vec::new(),
        }
    }

    /// nginx's hashed path: level directories named by the name's last
    /// characters (`levels=1 2`, `0000000123` -> `3/12/0000000123`).
    pub(crate) fn file_path(&self, name: &str) -> PathBuf {
        let mut p = self.path.clone();
        let mut end = name.len();
        for &l in &self.levels {
            let start = end.saturating_sub(l);
            p.push(&name[start..end]);
            end = start;
        }
        p.push(name);
        p
    }
}

/// `client_body_in_file_only`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileOnly {
    Off,
    /// The file is kept after the request.
    On,
    /// The file is removed when the request ends.
    Clean,
}

#[derive(Debug, Clone, Default)]
pub struct BodyLoc {
    pub temp_path: Option<Arc<TempDir>>,
    pub in_file_only: Option<FileOnly>,
    /// Accepted; a body in memory is always one buffer here, so
    /// `$request_body` never misses part of it.
    pub in_single_buffer: Option<bool>,
}

impl BodyLoc {
    pub fn merge(&mut self, p: &BodyLoc) {
        merge_opts!(self, p; temp_path, in_file_only, in_single_buffer);
    }
}

/// The level arguments of a `*_temp_path DIR [L1 [L2 [L3]]]` directive,
/// checked as nginx's path slot does: each level at least 1, all of them
/// within the ten characters of a temp file name.
pub fn temp_levels(d: &Directive) -> ConfResult<Vec<usize>> {
    let mut levels = Vec::new();
    for i in 1..d.args.len() {
        // Bounded first, so that the sum below cannot overflow.
        match value::number(arg(d, i)) {
            Some(n) if (1..=10).contains(&n) => levels.push(n as usize),
            _ => return Err(crate::config::registry::slot_invalid(d)),
        }
    }
    if levels.iter().sum::<usize>() > 10 {
        return Err(crate::config::registry::slot_invalid(d));
    }
    Ok(levels)
}

fn set_temp_path(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let levels = temp_levels(d)?;
    let t = TempDir::plain(cx.path(arg(d, 0)));
    set_once(
        &mut l.modules.body.temp_path,
        Arc::new(TempDir { levels, ..t }),
        d,
    )
}

fn set_file_only(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = arg(d, 0);
    let m = match v.to_ascii_lowercase().as_str() {
        "on" => FileOnly::On,
        "clean" => FileOnly::Clean,
        "off" => FileOnly::Off,
        _ => return Err(crate::config::registry::enum_invalid(d, v)),
    };
    set_once(&mut l.modules.body.in_file_only, m, d)
}

fn set_single_buffer(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut l.modules.body.in_single_buffer, v, d)
}

// ---- variables --------------------------------------------------------------

/// Module variables (see `modules::VAR_MODULES`).
pub const VARS: &[&str] = &["request_body", "request_body_file"];

pub fn var(cx: &Ctx<'_>, i: u8, out: &mut Vec<u8>) -> bool {
    let Some(data) = cx.body.as_ref().and_then(|b| b.data.as_ref()) else {
        return false;
    };
    match (i, data) {
        // As nginx: only a body held in memory.
        (0, Data::Mem(b)) => out.extend_from_slice(b),
        (1, Data::File { path, .. }) => {
            use std::os::unix::ffi::OsStrExt;
            out.extend_from_slice(path.as_os_str().as_bytes());
        }
        _ => return false,
    }
    true
}

/// `$content_length` without the header: a chunked body once read has a
/// length (nginx sets it when the last chunk arrives).
pub fn content_length_var(cx: &Ctx<'_>, out: &mut Vec<u8>) -> bool {
    match cx.body.as_ref() {
        Some(b) if b.end == End::Read => {
            crate::http::response::push_num(out, b.received);
            true
        }
        _ => false,
    }
}

// ---- the connection side ----------------------------------------------------

/// What the body reader needs of the connection: [`Stream`] made
/// object-safe, so that `Ctx` does not become generic over the socket.
pub trait BodyIo {
    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize>;
    fn readable(&self) -> Pin<Box<dyn Future<Output = io::Result<()>> + '_>>;
    fn try_write(&self, data: &[u8]) -> io::Result<usize>;
    fn writable(&self) -> Pin<Box<dyn Future<Output = io::Result<()>> + '_>>;
    fn try_flush(&self) -> io::Result<()>;
    /// Resolves when the client closes its side while nothing else
    /// arrived (nginx's broken-connection check); pending for ever once
    /// it sent more (a pipelined request), or where it cannot be told.
    fn hangup(&self) -> Pin<Box<dyn Future<Output = ()> + '_>> {
        Box::pin(std::future::pending())
    }
}

impl<S: Stream> BodyIo for S {
    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        Stream::try_read(self, buf)
    }
    fn readable(&self) -> Pin<Box<dyn Future<Output = io::Result<()>> + '_>> {
        Box::pin(Stream::readable(self))
    }
    fn try_write(&self, data: &[u8]) -> io::Result<usize> {
        Stream::try_write_vectored(self, &[IoSlice::new(data)])
    }
    fn writable(&self) -> Pin<Box<dyn Future<Output = io::Result<()>> + '_>> {
        Box::pin(crate::io::SendSock::writable(self))
    }
    fn try_flush(&self) -> io::Result<()> {
        Stream::try_flush(self)
    }
    fn hangup(&self) -> Pin<Box<dyn Future<Output = ()> + '_>> {
        Box::pin(crate::http::v1::conn::hangup(self))
    }
}

/// Where a request's body stands when the phases are over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Nobody asked for it: the engine discards it.
    Unread,
    /// Read whole: nothing of it is left on the connection.
    Read,
    /// Reading failed half-way: the connection cannot be reused.
    /// `silent`: nothing is sent (timeout, client gone), as nginx's
    /// terminate; `linger`: drain before closing (413, bad framing).
    Broken { silent: bool, linger: bool },
}

/// A body that was read.
pub enum Data {
    Mem(Bytes),
    File {
        file: Arc<OpenFile>,
        len: u64,
        /// The name it was created under (`$request_body_file`); already
        /// unlinked unless `client_body_in_file_only`.
        path: PathBuf,
        /// Removes the file when the request ends (`clean`).
        _clean: Option<RemoveOnDrop>,
    },
}

/// A request's body: the connection lent by the engine, and once read,
/// the data.
pub struct ReqBody<'a> {
    io: &'a dyn BodyIo,
    /// The connection's read buffer while the request runs.
    buf: Vec<u8>,
    end: End,
    data: Option<Data>,
    /// Body bytes received (decoded).
    received: u64,
    /// A stand-in while the real body is being streamed upstream
    /// ([`stream_begin`]).
    streaming: bool,
}

impl<'a> ReqBody<'a> {
    pub fn new(io: &'a dyn BodyIo, buf: Vec<u8>) -> ReqBody<'a> {
        ReqBody {
            io,
            buf,
            end: End::Unread,
            data: None,
            received: 0,
            streaming: false,
        }
    }
}

/// The connection of a body that is read already: a subrequest's share of
/// its parent's body never reads.
struct NoIo;

impl BodyIo for NoIo {
    fn try_read(&self, _: &mut [u8]) -> io::Result<usize> {
        Ok(0)
    }
    fn readable(&self) -> Pin<Box<dyn Future<Output = io::Result<()>> + '_>> {
        Box::pin(std::future::ready(Ok(())))
    }
    fn try_write(&self, data: &[u8]) -> io::Result<usize> {
        Ok(data.len())
    }
    fn writable(&self) -> Pin<Box<dyn Future<Output = io::Result<()>> + '_>> {
        Box::pin(std::future::ready(Ok(())))
    }
    fn try_flush(&self) -> io::Result<()> {
        Ok(())
    }
}

static NO_IO: NoIo = NoIo;

impl ReqBody<'_> {
    /// The body as a subrequest sees it (nginx: `sr->request_body =
    /// r->request_body`): the data once read, shared, not copied. None
    /// while it is unread: a subrequest never reads from the client.
    pub fn share<'b>(&self) -> Option<ReqBody<'b>> {
        if self.end != End::Read {
            return None;
        }
        let data = match &self.data {
            Some(Data::Mem(b)) => Some(Data::Mem(b.clone())),
            Some(Data::File {
                file, len, path, ..
            }) => Some(Data::File {
                file: file.clone(),
                len: *len,
                path: path.clone(),
                // The parent's copy removes the file.
                _clean: None,
            }),
            None => None,
        };
        Some(ReqBody {
            io: &NO_IO,
            buf: Vec::new(),
            end: End::Read,
            data,
            received: self.received,
            streaming: false,
        })
    }
}

/// Returns the connection's read buffer after the phases, and how the
/// body ended. The data stays for the log phase's variables.
pub fn give_back(cx: &mut Ctx<'_>, buf: &mut Vec<u8>) -> End {
    match cx.body.as_mut() {
        Some(b) => {
            *buf = std::mem::take(&mut b.buf);
            b.end
        }
        None => End::Unread,
    }
}

/// The body once read (None: no body, or not read).
pub fn data<'c>(cx: &'c Ctx<'_>) -> Option<&'c Data> {
    cx.body.as_ref().and_then(|b| b.data.as_ref())
}

/// The body's length as nginx's `content_length_n`: the length read, else
/// the declared Content-Length (None: neither).
pub fn length(cx: &Ctx<'_>) -> Option<u64> {
    match cx.body.as_ref() {
        Some(b) if b.end == End::Read => Some(b.received),
        _ => cx.req.content_length,
    }
}

/// Reads the whole body (nothing when none was announced or it is already
/// read). On failure the response to give, with the connection marked
/// broken; its error-log line is written here.
pub async fn read(cx: &mut Ctx<'_>, default_temp: &TempDir) -> Result<(), Box<Response>> {
    read_as(cx, default_temp, None).await
}

/// Reads the whole body into a named temp file under
/// `client_body_temp_path`, whatever its size, without the "buffered to
/// a temporary file" warning (nginx's `request_body_in_file_only`,
/// `_persistent_file`, `_clean_file` and `file_log_level = 0`, which the
/// dav module sets for PUT). The file is removed when the request ends
/// unless its owner takes it with [`take_named_file`]. A body that an
/// earlier handler already read stays where it is (memory or file).
pub async fn read_to_file(cx: &mut Ctx<'_>, default_temp: &TempDir) -> Result<(), Box<Response>> {
    read_as(cx, default_temp, Some(FileOnly::Clean)).await
}

/// The name of the body's temp file, taken over by the caller (who must
/// rename or remove it: it is no longer removed when the request ends).
/// None for a body in memory or in a file without a name.
pub fn take_named_file(cx: &mut Ctx<'_>) -> Option<PathBuf> {
    match cx.body.as_mut().and_then(|b| b.data.as_mut()) {
        Some(Data::File { path, _clean, .. }) => {
            let guard = _clean.take()?;
            std::mem::forget(guard);
            Some(path.clone())
        }
        _ => None,
    }
}

async fn read_as(
    cx: &mut Ctx<'_>,
    default_temp: &TempDir,
    force: Option<FileOnly>,
) -> Result<(), Box<Response>> {
    let Some(mut rb) = cx.body.take() else {
        return Ok(());
    };
    let r = match rb.end {
        End::Unread => read_all(cx, &mut rb, default_temp, force).await,
        End::Read => Ok(()),
        End::Broken { .. } => Err(400),
    };
    if r.is_ok() {
        rb.end = End::Read;
    }
    cx.body = Some(rb);
    r.map_err(|status| Box::new(Response::status(status)))
}

/// Bytes asked of one socket read.
const READ_SIZE: usize = 64 * 1024;

async fn read_all(
    cx: &Ctx<'_>,
    rb: &mut ReqBody<'_>,
    default_temp: &TempDir,
    force: Option<FileOnly>,
) -> Result<(), u16> {
    let loc = cx.loc.clone();
    let core = &loc.core;
    let max = core.client_max_body_size.unwrap_or(1 << 20);
    let mem_max = core.client_body_buffer_size.unwrap_or(16 << 10);
    let wait = Duration::from_millis(core.client_body_timeout.unwrap_or(60_000));
    let keep = force.unwrap_or(loc.modules.body.in_file_only.unwrap_or(FileOnly::Off));
    let temp = loc
        .modules
        .body
        .temp_path
        .as_deref()
        .unwrap_or(default_temp);
    let policy = cx.io_policy().map_err(|r| {
        rb.end = End::Broken {
            silent: false,
            linger: true,
        };
        r.status
    })?;
    let broken = |rb: &mut ReqBody<'_>, silent: bool| {
        rb.end = End::Broken {
            silent,
            linger: !silent,
        };
    };
    if cx.req.expect_continue {
        let send = Duration::from_millis(core.send_timeout.unwrap_or(60_000));
        if write_all(rb.io, b"HTTP/1.1 100 Continue\r\n\r\n", send)
            .await
            .is_err()
        {
            broken(rb, true);
            return Err(400);
        }
    }
    let mut left = cx.req.content_length;
    let mut dec = left.is_none().then(ChunkedDecoder::new);
    // nginx's sizing. HTTP/1: what came with the head stays in memory,
    // and the buffer for the rest is client_body_buffer_size, or the rest
    // itself when that is under 1.25 times the size; the body goes to a
    // file only when it outgrows both. HTTP/2 (nginx's v2 body reader):
    // one buffer of client_body_buffer_size (of the length when that is
    // smaller), so a body longer than the size goes to a file.
    let preread = rb.buf.len() as u64;
    let buffer = match left {
        _ if cx.req.proto() == b"HTTP/2.0" => mem_max,
        Some(n) if n.saturating_sub(preread) < mem_max.saturating_add(mem_max / 4) => {
            n.saturating_sub(preread)
        }
        _ => mem_max,
    };
    let in_mem_max = preread.saturating_add(buffer);
    let mut sink = Sink {
        mem: Vec::new(),
        mem_max: in_mem_max,
        file: None,
        written: 0,
        stage: Vec::new(),
        stage_max: mem_max.clamp(4096, STAGE as u64) as usize,
        keep,
        quiet: force.is_some(),
    };
    if let Some(n) = left.filter(|&n| n <= in_mem_max && keep == FileOnly::Off) {
        sink.mem.reserve_exact(n as usize);
    }
    // A body longer than the buffer gets its file when the buffer is full,
    // as in nginx (not before: a slow upload holds no descriptor while it
    // fits in memory).
    if keep != FileOnly::Off {
        if let Err(e) = sink.start_file(cx, temp, &policy).await {
            log_file_error(cx, temp, &e);
            broken(rb, false);
            return Err(500);
        }
    }
    let mut out: Vec<u8> = Vec::new();
    loop {
        let done = match (&mut dec, &mut left) {
            (Some(d), _) => {
                let used = match d.decode(&rb.buf, &mut out) {
                    Ok(n) => n,
                    Err(_) => {
                        cx.log(Level::Error, "client sent invalid chunked body");
                        broken(rb, false);
                        return Err(400);
                    }
                };
                rb.buf.drain(..used);
                let so_far = rb.received + out.len() as u64;
                if max != 0 && so_far.saturating_add(d.chunk_remaining()) > max {
                    cx.log(
                        Level::Error,
                        &format!(
                            "client intended to send too large chunked body: {}+{} bytes",
                            so_far,
                            d.chunk_remaining()
                        ),
                    );
                    broken(rb, false);
                    return Err(413);
                }
                d.is_done()
            }
            (None, Some(l)) => {
                // No decoding: the bytes go to the sink as they are.
                let take = (*l).min(rb.buf.len() as u64) as usize;
                if take > 0 {
                    rb.received += take as u64;
                    if let Err(e) = sink.push(cx, &rb.buf[..take], temp, &policy).await {
                        log_file_error(cx, temp, &e);
                        broken(rb, false);
                        return Err(500);
                    }
                    rb.buf.drain(..take);
                    *l -= take as u64;
                }
                *l == 0
            }
            (None, None) => true,
        };
        if !out.is_empty() {
            rb.received += out.len() as u64;
            if let Err(e) = sink.push(cx, &out, temp, &policy).await {
                log_file_error(cx, temp, &e);
                broken(rb, false);
                return Err(500);
            }
            out.clear();
        }
        if done {
            break;
        }
        // Reads of at most the body buffer (nginx reads into its
        // client_body_buffer_size buffer), so that what a slow client's
        // body holds in memory stays within that size.
        let read_max = READ_SIZE.min(sink.stage_max);
        let want = left.map_or(read_max, |l| l.min(read_max as u64) as usize);
        // A body with a length, once what came with the head is used,
        // is read straight into the sink's buffer: no read buffer and no
        // copy beside it, so a slow upload holds about
        // client_body_buffer_size (nginx reads into that one buffer too).
        let direct = dec.is_none() && rb.buf.is_empty();
        let want = if direct { sink.room(want) } else { want };
        let dst = if direct {
            sink.read_buffer(want)
        } else {
            &mut rb.buf
        };
        let start = dst.len();
        dst.resize(start + want, 0);
        let got = rb.io.try_read(&mut dst[start..]);
        dst.truncate(start + *got.as_ref().unwrap_or(&0));
        match got {
            Ok(n) if n > 0 && direct => {
                if let Some(l) = left.as_mut() {
                    *l -= n as u64;
                }
                rb.received += n as u64;
                if let Err(e) = sink.settle(cx, temp, &policy).await {
                    log_file_error(cx, temp, &e);
                    broken(rb, false);
                    return Err(500);
                }
                if left == Some(0) {
                    break;
                }
            }
            Ok(0) => {
                // Over HTTP/2 and HTTP/3 the end of the stream is the end
                // of the body, not a lost connection: a body shorter than
                // its Content-Length is a malformed request, answered 400
                // (nginx's request body filters of v2 and v3).
                let framed = !cx.req.proto().starts_with(b"HTTP/1") && !cx.req.proto().is_empty();
                if let (Some(l), true) = (left, framed) {
                    let total = l + rb.received;
                    cx.log(
                        Level::Info,
                        &format!(
                            "client prematurely closed stream: only {} out of {} bytes of request body received",
                            total - l,
                            total
                        ),
                    );
                    broken(rb, false);
                    return Err(400);
                }
                cx.log(Level::Info, "client prematurely closed connection");
                broken(rb, true);
                return Err(400);
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                match tokio::time::timeout(wait, rb.io.readable()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        broken(rb, !larger_than_declared(&e, cx));
                        return Err(400);
                    }
                    // nginx logs nothing here; the access log has the 408.
                    Err(_) => {
                        broken(rb, true);
                        return Err(408);
                    }
                }
            }
            Err(e) => {
                broken(rb, !larger_than_declared(&e, cx));
                return Err(400);
            }
        }
    }
    match sink.finish(&policy).await {
        Ok(d) => {
            rb.data = Some(d);
            Ok(())
        }
        Err(e) => {
            log_file_error(cx, temp, &e);
            broken(rb, false);
            Err(500)
        }
    }
}

// ---- a body sent on as it arrives ------------------------------------------

/// A request body read piece by piece while it goes upstream
/// (`PREFIX_request_buffering off`, nginx's `request_body_no_buffering`).
/// It holds the connection's [`ReqBody`] while the exchange runs (the
/// request's `Ctx::body` holds a stand-in that says so, see
/// [`streaming`]) and gives it back with [`Streaming::finish`].
///
/// What it read is also kept while it fits `client_body_buffer_size`, so
/// that `$request_body` works after it as with a buffered body.
pub struct Streaming<'a> {
    rb: ReqBody<'a>,
    dec: Option<ChunkedDecoder>,
    left: Option<u64>,
    max: u64,
    wait: Duration,
    kept: Option<Vec<u8>>,
    kept_max: u64,
    /// The last piece was read.
    done: bool,
    /// HTTP/2 or /3: the body ends with the stream, also when it has a
    /// length (which is then checked against it).
    framed: bool,
    /// Something of the body was taken from the connection.
    touched: bool,
    /// Log lines are written with the request's context, taken at start.
    logger: Arc<crate::core::log::Logger>,
    conn: u64,
    ctx_tail: String,
}

/// The body is being streamed upstream (it is neither read nor unread).
pub fn streaming(cx: &Ctx<'_>) -> bool {
    cx.body.as_ref().is_some_and(|b| b.streaming)
}

/// Starts streaming the request's body: None when there is none, or it
/// was read already (a subrequest, an earlier handler), or
/// `client_body_in_file_only` asks for a file (nginx turns unbuffered
/// reading off then). `Expect: 100-continue` is answered here.
pub async fn stream_begin<'c>(cx: &mut Ctx<'c>) -> Result<Option<Streaming<'c>>, Box<Response>> {
    let loc = cx.loc.clone();
    if loc.modules.body.in_file_only.unwrap_or(FileOnly::Off) != FileOnly::Off {
        return Ok(None);
    }
    match cx.body.as_ref() {
        Some(b) if b.end == End::Unread && !b.streaming => {}
        _ => return Ok(None),
    }
    let Some(mut rb) = cx.body.take() else {
        return Ok(None);
    };
    let core = &loc.core;
    if cx.req.expect_continue {
        let send = Duration::from_millis(core.send_timeout.unwrap_or(60_000));
        if write_all(rb.io, b"HTTP/1.1 100 Continue\r\n\r\n", send)
            .await
            .is_err()
        {
            rb.end = End::Broken {
                silent: true,
                linger: false,
            };
            cx.body = Some(rb);
            return Err(Box::new(Response::status(400)));
        }
    }
    let left = cx.req.content_length;
    let host = cx.log_host_ctx();
    let s = Streaming {
        dec: left.is_none().then(ChunkedDecoder::new),
        left,
        max: core.client_max_body_size.unwrap_or(1 << 20),
        wait: Duration::from_millis(core.client_body_timeout.unwrap_or(60_000)),
        kept: Some(Vec::new()),
        kept_max: core.client_body_buffer_size.unwrap_or(16 << 10),
        done: false,
        framed: left.is_some()
            && cx.req.proto().starts_with(b"HTTP/")
            && !cx.req.proto().starts_with(b"HTTP/1"),
        touched: false,
        logger: cx.logger(),
        conn: cx.conn.id,
        ctx_tail: format!("{}{}", cx.log_request_ctx(), host),
        rb,
    };
    cx.body = Some(ReqBody {
        io: &NO_IO,
        buf: Vec::new(),
        end: End::Unread,
        data: None,
        received: 0,
        streaming: true,
    });
    Ok(Some(s))
}

impl<'a> Streaming<'a> {
    /// The body's length when the client declared it.
    pub fn length(&self) -> Option<u64> {
        self.left.map(|l| l + self.rb.received)
    }

    /// Nothing of the body was taken yet: it could still go to another
    /// peer.
    pub fn untouched(&self) -> bool {
        !self.touched
    }

    /// The last piece was given.
    pub fn done(&self) -> bool {
        self.done
    }

    fn log(&self, level: Level, msg: &str) {
        self.logger.log(
            level,
            Some(self.conn),
            format_args!("{}{}", msg, self.ctx_tail),
        );
    }

    /// As [`larger_than_declared`].
    fn larger_than_declared(&self, e: &io::Error) -> bool {
        let over = e.kind() == io::ErrorKind::InvalidData;
        if over {
            self.log(
                Level::Info,
                "client intended to send body data larger than declared",
            );
        }
        over
    }

    fn broken(&mut self, silent: bool) {
        self.rb.end = End::Broken {
            silent,
            linger: !silent,
        };
    }

    /// The next piece of the body as it arrives (what is buffered first,
    /// then each read, with what more is there at once); None at its end.
    /// Err: the status for the client (its log line written), the
    /// connection marked as nginx would.
    pub async fn next(&mut self) -> Result<Option<Bytes>, u16> {
        let mut out = Vec::new();
        loop {
            if self.done {
                return Ok(None);
            }
            self.decode(&mut out)?;
            if !out.is_empty() {
                // Whatever else arrived already goes in the same piece
                // (HTTP/2 DATA frames that came together: one chunk, as
                // nginx's buffer).
                while !self.done && out.len() < READ_SIZE && self.read_now()? {
                    self.decode(&mut out)?;
                }
                self.rb.received += out.len() as u64;
                if let Some(k) = &mut self.kept {
                    if (k.len() + out.len()) as u64 <= self.kept_max {
                        k.extend_from_slice(&out);
                    } else {
                        self.kept = None;
                    }
                }
                return Ok(Some(Bytes::from(out)));
            }
            if self.done {
                return Ok(None);
            }
            match tokio::time::timeout(self.wait, self.rb.io.readable()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    let over = self.larger_than_declared(&e);
                    self.broken(!over);
                    return Err(400);
                }
                // As a buffered body: nothing logged, 408.
                Err(_) => {
                    self.broken(true);
                    return Err(408);
                }
            }
            self.read_now()?;
        }
    }

    /// Decodes what the buffer holds into `out`; sets `done` at the end.
    fn decode(&mut self, out: &mut Vec<u8>) -> Result<(), u16> {
        let before = out.len();
        match (&mut self.dec, &mut self.left) {
            (Some(d), _) => {
                let used = match d.decode(&self.rb.buf, out) {
                    Ok(n) => n,
                    Err(_) => {
                        self.log(Level::Error, "client sent invalid chunked body");
                        self.broken(false);
                        return Err(400);
                    }
                };
                if used > 0 {
                    self.touched = true;
                }
                self.rb.buf.drain(..used);
                let so_far = self.rb.received + out.len() as u64;
                if self.max != 0 && so_far.saturating_add(d.chunk_remaining()) > self.max {
                    let m = format!(
                        "client intended to send too large chunked body: {}+{} bytes",
                        so_far,
                        d.chunk_remaining()
                    );
                    self.log(Level::Error, &m);
                    self.broken(false);
                    return Err(413);
                }
                self.done = d.is_done();
            }
            (None, Some(l)) => {
                if *l == 0 && self.framed && !self.rb.buf.is_empty() {
                    self.log(
                        Level::Info,
                        "client intended to send body data larger than declared",
                    );
                    self.broken(false);
                    return Err(400);
                }
                let take = (*l).min(self.rb.buf.len() as u64) as usize;
                out.extend_from_slice(&self.rb.buf[..take]);
                self.rb.buf.drain(..take);
                *l -= take as u64;
                // An HTTP/2 or /3 body ends with its stream, which may
                // still bring more than declared.
                self.done = *l == 0 && !self.framed;
            }
            (None, None) => self.done = true,
        }
        if out.len() > before {
            self.touched = true;
        }
        Ok(())
    }

    /// One read of what the connection has now; false: nothing there.
    fn read_now(&mut self) -> Result<bool, u16> {
        // Polled once, not waited for: an HTTP/2 stream's data sits in
        // the HTTP/2 layer until then (a socket answers from its readiness).
        {
            let mut f = std::pin::pin!(self.rb.io.readable());
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            if f.as_mut().poll(&mut cx).is_pending() {
                return Ok(false);
            }
        }
        let want = match self.left {
            Some(l) if !self.framed => l.min(READ_SIZE as u64) as usize,
            _ => READ_SIZE,
        };
        if want == 0 {
            return Ok(false);
        }
        // Appended: a chunk-size line may be waiting for its end.
        let start = self.rb.buf.len();
        self.rb.buf.resize(start + want, 0);
        match self.rb.io.try_read(&mut self.rb.buf[start..]) {
            Ok(0) => {
                self.rb.buf.truncate(start);
                match self.left {
                    Some(0) if self.framed => {
                        self.done = true;
                        Ok(false)
                    }
                    Some(l) if self.framed => {
                        let total = l + self.rb.received;
                        self.log(
                            Level::Info,
                            &format!(
                                "client prematurely closed stream: only {} out of {} bytes of request body received",
                                total - l,
                                total
                            ),
                        );
                        self.broken(false);
                        Err(400)
                    }
                    _ => {
                        self.log(Level::Info, "client prematurely closed connection");
                        self.broken(true);
                        Err(400)
                    }
                }
            }
            Ok(n) => {
                self.touched = true;
                self.rb.buf.truncate(start + n);
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.rb.buf.truncate(start);
                Ok(false)
            }
            Err(e) => {
                self.rb.buf.truncate(start);
                let over = self.larger_than_declared(&e);
                self.broken(!over);
                Err(400)
            }
        }
    }

    /// Gives the connection's body back to the request: read whole (what
    /// was kept becomes `$request_body`), untouched (the engine discards
    /// it as an unread one), or left half-read (the connection closes
    /// after the response).
    pub fn finish(mut self, cx: &mut Ctx<'a>) {
        if self.rb.end == End::Unread {
            if self.done {
                self.rb.end = End::Read;
                self.rb.data = self.kept.take().map(|k| Data::Mem(Bytes::from(k)));
            } else if self.touched {
                self.rb.end = End::Broken {
                    silent: false,
                    linger: true,
                };
            }
        }
        cx.body = Some(self.rb);
    }
}

fn log_file_error(cx: &Ctx<'_>, temp: &TempDir, e: &io::Error) {
    cx.log(
        Level::Crit,
        &format!(
            "client request body temp file in \"{}\" failed {}",
            temp.path.display(),
            crate::core::errno_text(e)
        ),
    );
}

/// Writes all of `data`, waiting at most `wait` between two writes.
async fn write_all(io: &dyn BodyIo, data: &[u8], wait: Duration) -> io::Result<()> {
    let mut off = 0;
    // Past the data: what the stream still holds (TLS records) goes out.
    let mut flushed = false;
    while !flushed {
        let r = if off < data.len() {
            io.try_write(&data[off..])
        } else {
            io.try_flush().map(|()| {
                flushed = true;
                0
            })
        };
        match r {
            Ok(n) => off += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                match tokio::time::timeout(wait, io.writable()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(e),
                    Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "send_timeout")),
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

// ---- memory, then a temp file -----------------------------------------------

/// File writes are gathered up to client_body_buffer_size, at most this
/// (fewer, larger writes for a large buffer).
const STAGE: usize = 64 * 1024;

/// Numbers temp files as nginx does (ten digits); a name taken by another
/// process moves on to the next.
static SEQ: AtomicU64 = AtomicU64::new(0);

/// The next temp file name (ten digits), as the body's temp files are named.
pub(crate) fn next_temp_name() -> String {
    let n = SEQ.fetch_add(1, Ordering::Relaxed) + u64::from(std::process::id()) * 100_000;
    format!("{:010}", n % 10_000_000_000)
}

/// Removes a file when dropped (`client_body_in_file_only clean`, or a
/// named file whose body never completed). The unlink runs inline: only
/// these explicitly configured files ever need it.
pub struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

struct TempFile {
    file: Arc<std::fs::File>,
    path: PathBuf,
    /// Set while the file has a name that must go if the body fails.
    remove: Option<RemoveOnDrop>,
}

struct Sink {
    mem: Vec<u8>,
    mem_max: u64,
    file: Option<TempFile>,
    /// Bytes already in the file.
    written: u64,
    /// Bytes for the file not yet written.
    stage: Vec<u8>,
    /// Written out once this big: client_body_buffer_size (within 4 KiB
    /// and [`STAGE`]), so a slow body holds no more than that in memory.
    stage_max: usize,
    keep: FileOnly,
    /// No "buffered to a temporary file" warning (the caller asked for
    /// the file).
    quiet: bool,
}

impl Sink {
    async fn start_file(
        &mut self,
        cx: &Ctx<'_>,
        temp: &TempDir,
        policy: &Policy,
    ) -> io::Result<()> {
        let keep = self.keep;
        let mut tries = 0;
        let f = loop {
            let path = temp.file_path(&next_temp_name());
            match create(path.clone(), keep == FileOnly::Off, policy).await {
                Ok(f) => break (f, path),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && tries < 16 => tries += 1,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied
                    ) && tries < 16 =>
                {
                    // The top directory may need the keeper (it was made
                    // for the workers' user); levels below it are ours.
                    tries = 16;
                    crate::cache::prepare_dir(&temp.path).await?;
                }
                Err(e) => return Err(e),
            }
        };
        if !self.quiet {
            // nginx: `warn`, `notice` for client_body_in_file_only.
            let level = if keep == FileOnly::Off {
                Level::Warn
            } else {
                Level::Notice
            };
            cx.log(
                level,
                &format!(
                    "a client request body is buffered to a temporary file {}",
                    f.1.display()
                ),
            );
        }
        let remove = (keep != FileOnly::Off).then(|| RemoveOnDrop(f.1.clone()));
        self.file = Some(TempFile {
            file: f.0,
            path: f.1,
            remove,
        });
        self.stage = std::mem::take(&mut self.mem);
        Ok(())
    }

    async fn push(
        &mut self,
        cx: &Ctx<'_>,
        data: &[u8],
        temp: &TempDir,
        policy: &Policy,
    ) -> io::Result<()> {
        // Grown as a Vec grows: pieces of a chunked body can be small.
        self.read_buffer(0).extend_from_slice(data);
        self.settle(cx, temp, policy).await
    }

    /// The buffer the next bytes of the body go to (room for `want` more
    /// made): memory while there is no file, then the stage for the file.
    fn read_buffer(&mut self, want: usize) -> &mut Vec<u8> {
        let buf = if self.file.is_none() {
            &mut self.mem
        } else {
            &mut self.stage
        };
        // Exactly: a slow body's buffer is not doubled by small reads.
        buf.reserve_exact(want);
        buf
    }

    /// How much the next read into [`Sink::read_buffer`] may add: a stage
    /// is filled up to its size and then written out, never grown.
    fn room(&self, want: usize) -> usize {
        // Memory is filled to one byte past its limit (which moves the
        // body to a file), the stage to its size.
        let room = match self.file {
            None => (self.mem_max + 1).saturating_sub(self.mem.len() as u64) as usize,
            Some(_) => self.stage_max.saturating_sub(self.stage.len()),
        };
        want.min(room.max(1))
    }

    /// After bytes were added to [`Sink::read_buffer`]: a body outgrowing
    /// memory moves to a file, a full stage is written out.
    async fn settle(&mut self, cx: &Ctx<'_>, temp: &TempDir, policy: &Policy) -> io::Result<()> {
        if self.file.is_none() {
            if self.mem.len() as u64 <= self.mem_max {
                return Ok(());
            }
            self.start_file(cx, temp, policy).await?;
        }
        if self.stage.len() >= self.stage_max {
            self.flush(policy).await?;
        }
        Ok(())
    }

    async fn flush(&mut self, policy: &Policy) -> io::Result<()> {
        let Some(tf) = &self.file else {
            return Ok(());
        };
        if self.stage.is_empty() {
            return Ok(());
        }
        let data = Bytes::from(std::mem::take(&mut self.stage));
        let n = data.len() as u64;
        crate::io::write_at(&tf.file, self.written, data, policy).await?;
        self.written += n;
        Ok(())
    }

    async fn finish(mut self, policy: &Policy) -> io::Result<Data> {
        if self.file.is_none() {
            return Ok(Data::Mem(Bytes::from(self.mem)));
        }
        self.flush(policy).await?;
        let Some(mut tf) = self.file.take() else {
            return Err(io::Error::other("no temp file"));
        };
        let f = tf.file.try_clone()?;
        let open = crate::cache::blocking(policy, move || OpenFile::from_file(f)).await?;
        // `on` keeps the file after the request; `clean` removes it then.
        let clean = match (tf.remove.take(), self.keep) {
            (Some(r), FileOnly::Clean) => Some(r),
            (Some(r), _) => {
                std::mem::forget(r);
                None
            }
            (None, _) => None,
        };
        Ok(Data::File {
            file: Arc::new(open),
            len: self.written,
            path: tf.path,
            _clean: clean,
        })
    }
}

/// Creates a temp file (0600, read-write) and its level directories, and
/// unlinks it at once when `unlink`. Also proxy's cache and buffer files.
///
/// An unlinked one is made without a name where the filesystem can
/// (`O_TMPFILE`): a server killed between the create and the unlink would
/// otherwise leave the file behind.
pub(crate) async fn create(
    path: PathBuf,
    unlink: bool,
    policy: &Policy,
) -> io::Result<Arc<std::fs::File>> {
    crate::cache::blocking(policy, move || {
        use std::os::unix::fs::OpenOptionsExt;
        let unnamed = |dir: &std::path::Path| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .mode(0o600)
                .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
                .open(dir)
        };
        if let (true, Some(dir)) = (unlink, path.parent()) {
            let f = match unnamed(dir) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    std::fs::create_dir_all(dir)?;
                    unnamed(dir)
                }
                r => r,
            };
            match f {
                Ok(f) => return Ok(Arc::new(f)),
                // Not supported there (EOPNOTSUPP, EISDIR on old kernels,
                // EINVAL): a named file, unlinked below.
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
                    ) => {}
                Err(e) => return Err(e),
            }
        }
        let open = || {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_CLOEXEC)
                .open(&path)
        };
        let f = match open() {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                open()
            }
            r => r,
        }?;
        if unlink {
            std::fs::remove_file(&path)?;
        }
        Ok(Arc::new(f))
    })
    .await
}

/// Whether a body read failed because more came than the request
/// declared (an HTTP/2 or /3 stream, whose layer counts it): nginx's 400,
/// logged, and the answer is sent (not a silent end).
fn larger_than_declared(e: &io::Error, cx: &Ctx<'_>) -> bool {
    let over = e.kind() == io::ErrorKind::InvalidData;
    if over {
        cx.log(
            Level::Info,
            "client intended to send body data larger than declared",
        );
    }
    over
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashed_temp_paths_as_nginx() {
        let t = |levels: Vec<usize>| TempDir {
            path: PathBuf::from("/t"),
            levels,
        };
        assert_eq!(
            t(vec![1, 2]).file_path("0000000123"),
            PathBuf::from("/t/3/12/0000000123")
        );
        assert_eq!(
            t(vec![2, 2, 1]).file_path("0000054321"),
            PathBuf::from("/t/21/43/5/0000054321")
        );
        assert_eq!(
            t(vec![]).file_path("0000000001"),
            PathBuf::from("/t/0000000001")
        );
    }

    #[test]
    fn chunk_remaining_is_the_announced_rest() {
        let mut d = ChunkedDecoder::new();
        let mut out = Vec::new();
        assert_eq!(d.decode(b"a;x\r\nhel", &mut out), Ok(8));
        assert_eq!((out.as_slice(), d.chunk_remaining()), (&b"hel"[..], 7));
        assert_eq!(d.decode(b"lo worl", &mut out), Ok(7));
        assert_eq!(d.chunk_remaining(), 0);
        assert_eq!(d.decode(b"\r\n0\r\n\r\n", &mut out), Ok(7));
        assert!(d.is_done());
        assert_eq!(out, b"hello worl");
    }
}

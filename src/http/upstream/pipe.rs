//! The pipe (nginx's ngx_event_pipe): the upstream body on its way to the
//! client, read as fast as upstream sends it whatever the client's pace.
//!
//! ```text
//!  upstream ──Producer──▶ Pipe (queue of Seg) ──Consumer──▶ conn::write_streamed ──▶ client
//!              │            Mem: up to PREFIX_buffers in all
//!              │            File: temp file (unlinked at creation) up to
//!              │                  PREFIX_max_temp_file_size written in all
//!              └─ both full: stop reading upstream until the client takes data
//! ```
//!
//! A fast upstream is read to its end and released (back to the keepalive
//! cache when reusable) whatever the client's pace. `PREFIX_buffering off`
//! has no file and PREFIX_buffer_size of memory. A response being cached is
//! written whole to its cache temp file as it arrives (the client reads it
//! back from there) and does not wait for the client; once complete it gets
//! its header and is renamed into place, and only then does the client get
//! the last piece, so a request that follows a complete response finds the
//! entry. An upstream failure after the head closes the client connection
//! (no error page, no last chunk) and removes the cache temp file; a client
//! that leaves stops the reading (unless the response is being cached, as
//! nginx) and so frees the upstream connection and the temp file. A
//! `PREFIX_store` file is written beside and renamed into place at the end.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::fetch::{fail, timed_read, Fail, UpLog};
use super::peers::{self, PeerAddr, Upstream};
use super::BodyDecoder;
use crate::cache::{self, file::EntryHead, Zone};
use crate::core::log::Level;
use crate::http::response::Body;
use crate::io::Policy;
use crate::tls::client::UpStream;

pub(super) enum Seg {
    Mem(Bytes),
    File(u64, u64),
}

#[derive(Default)]
pub(super) struct PipeState {
    pub(super) queue: std::collections::VecDeque<Seg>,
    /// Bytes of `Seg::Mem` queued (bounded by PREFIX_buffers).
    pub(super) mem: usize,
    /// The file `Seg::File` ranges are in.
    pub(super) file: Option<Arc<File>>,
    /// Set once the body is complete (Ok) or broken (Err: what to tell
    /// the connection).
    pub(super) end: Option<Result<(), String>>,
    /// The client side was dropped (client gone, or it needed no body).
    pub(super) gone: bool,
}

/// The body on its way from the upstream reader ([`Producer`]) to the
/// connection ([`Consumer`]).
#[derive(Default)]
pub struct Pipe {
    state: std::sync::Mutex<PipeState>,
    /// Data or the end was queued.
    data: tokio::sync::Notify,
    /// The consumer took data, or left.
    room: tokio::sync::Notify,
}

impl Pipe {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, PipeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, seg: Seg) {
        {
            let mut p = self.lock();
            match (seg, p.queue.back_mut()) {
                (Seg::File(o, l), Some(Seg::File(bo, bl))) if *bo + *bl == o => *bl += l,
                (Seg::Mem(b), _) => {
                    p.mem += b.len();
                    p.queue.push_back(Seg::Mem(b));
                }
                (s, _) => p.queue.push_back(s),
            }
        }
        self.data.notify_one();
    }

    fn finish(&self, end: Result<(), String>) {
        self.lock().end = Some(end);
        self.data.notify_one();
    }
}

/// A body already complete in memory, sent as a stream all the same:
/// the client is told no length (chunked), as nginx tells it when
/// upstream did not say one.
pub fn complete_stream(data: Vec<u8>, policy: Policy) -> Body {
    let pipe = Arc::new(Pipe::default());
    if !data.is_empty() {
        pipe.push(Seg::Mem(Bytes::from(data)));
    }
    pipe.finish(Ok(()));
    Body::Stream(Box::new(Consumer { pipe, policy }))
}

/// Pieces read back from a file are at most this big.
const FILE_PIECE: u64 = 64 * 1024;

/// The connection's end of the pipe: a [`BodyStream`].
pub struct Consumer {
    pub pipe: Arc<Pipe>,
    pub policy: Policy,
}

impl Consumer {
    async fn next_piece(&mut self) -> io::Result<Option<Bytes>> {
        loop {
            let from_file = {
                let mut p = self.pipe.lock();
                match p.queue.pop_front() {
                    Some(Seg::Mem(b)) => {
                        p.mem -= b.len();
                        drop(p);
                        self.pipe.room.notify_one();
                        return Ok(Some(b));
                    }
                    Some(Seg::File(off, len)) => {
                        let n = len.min(FILE_PIECE);
                        if len > n {
                            p.queue.push_front(Seg::File(off + n, len - n));
                        }
                        p.file.clone().map(|f| (f, off, n))
                    }
                    None => match &p.end {
                        Some(Ok(())) => return Ok(None),
                        Some(Err(e)) => return Err(io::Error::other(e.clone())),
                        None => None,
                    },
                }
            };
            if let Some((f, off, n)) = from_file {
                let policy = self.policy.clone();
                let data = cache::blocking(&policy, move || {
                    use std::os::unix::fs::FileExt;
                    let mut b = vec![0u8; n as usize];
                    f.read_exact_at(&mut b, off)?;
                    Ok(Bytes::from(b))
                })
                .await?;
                self.pipe.room.notify_one();
                return Ok(Some(data));
            }
            self.pipe.data.notified().await;
        }
    }
}

impl crate::http::response::BodyStream for Consumer {
    fn next(&mut self) -> std::pin::Pin<Box<dyn crate::http::response::StreamFuture<'_> + '_>> {
        Box::pin(self.next_piece())
    }

    fn ready(&self) -> bool {
        let p = self.pipe.lock();
        !p.queue.is_empty() || p.end.is_some()
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.pipe.lock().gone = true;
        self.pipe.room.notify_one();
        self.pipe.data.notify_one();
    }
}

/// The cache entry being written as the body arrives.
pub struct CacheOut {
    pub(super) zone: Arc<Zone>,
    pub(super) md5: [u8; 16],
    pub(super) file: Arc<File>,
    pub(super) path: PathBuf,
    pub(super) eh: EntryHead,
    /// Where the body starts (the header's length).
    pub(super) base: u64,
    pub(super) written: u64,
    /// The length upstream declared: a body that ends with the
    /// connection at another length is not stored (nginx checks it on
    /// upstream_eof before ngx_http_file_cache_update).
    pub(super) declared: Option<u64>,
    /// The last range written, shown to the client only after the entry
    /// is committed, so that a request made once this response is
    /// complete finds the entry.
    pub(super) held: Option<(u64, u64)>,
    /// The key's `updating` mark, released once the entry is stored (or
    /// given up).
    pub(super) _guard: Option<cache::UpdateGuard>,
}

/// Why the reader stopped early.
enum Stop {
    Fail(Fail),
    /// The client left and nothing needs the rest.
    Gone,
}

impl From<Fail> for Stop {
    fn from(f: Fail) -> Stop {
        Stop::Fail(f)
    }
}

/// Reads the upstream body as it comes, independent of the client: into
/// memory up to PREFIX_buffers, then a temp file up to
/// PREFIX_max_temp_file_size, then it waits for the client; a response
/// being cached goes whole into its cache file.
pub struct Producer {
    pub pipe: Arc<Pipe>,
    pub stream: UpStream,
    /// Dropped with the producer, when the body is done.
    pub _lease: Option<peers::Lease>,
    pub decoder: Box<dyn BodyDecoder>,
    pub read_timeout: Duration,
    pub mem_max: usize,
    pub temp_max: u64,
    /// PREFIX_buffering (or a response being cached in the background).
    pub buffered: bool,
    pub temp_dir: PathBuf,
    pub policy: Policy,
    pub temp: Option<Arc<File>>,
    pub temp_len: u64,
    pub cache: Option<CacheOut>,
    /// Where a complete, reusable connection goes, and the requests it
    /// has carried.
    pub keep: Option<(Arc<Upstream>, PeerAddr, crate::http::upstream::peers::Uses)>,
    pub log: UpLog,
    /// `PREFIX_limit_rate` in bytes per second (0: none).
    pub limit_rate: u64,
    /// `PREFIX_store`: the file the body is copied to.
    pub store: Option<StoreOut>,
    /// The attempt's record: bytes read, and the response time, set once
    /// the body is read (before the client sees its end, so that the log
    /// line has it).
    pub slot: super::state::Slot,
}

/// A `PREFIX_store` file being written: a named temp file, renamed to
/// `dest` (directories made as needed) once the body is complete.
pub struct StoreOut {
    pub(super) file: Arc<File>,
    pub(super) path: PathBuf,
    pub(super) dest: PathBuf,
    pub(super) mode: u32,
    pub(super) mtime: Option<std::time::SystemTime>,
    pub(super) written: u64,
}

/// A named temp file in `dir` (made when missing).
pub(super) async fn named_temp(dir: &Path, policy: &Policy) -> io::Result<(Arc<File>, PathBuf)> {
    let path = dir.join(format!(
        "tern-store-{}-{}",
        std::process::id(),
        TEMP_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    match create_file(path.clone(), policy).await {
        Ok(f) => Ok((f, path)),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied
            ) =>
        {
            cache::prepare_dir(dir).await?;
            Ok((create_file(path.clone(), policy).await?, path))
        }
        Err(e) => Err(e),
    }
}

/// Puts a complete `PREFIX_store` file in place: its mode
/// (`PREFIX_store_access`), its mtime (upstream's Last-Modified), then the
/// rename (a copy across file systems), making directories as nginx does
/// (the file's mode plus x where r is).
async fn commit_store(st: StoreOut, policy: &Policy) -> io::Result<()> {
    cache::blocking(policy, move || {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        st.file
            .set_permissions(std::fs::Permissions::from_mode(st.mode))?;
        if let Some(t) = st.mtime {
            st.file.set_modified(t)?;
        }
        let place = || match std::fs::rename(&st.path, &st.dest) {
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                std::fs::copy(&st.path, &st.dest)?;
                std::fs::remove_file(&st.path)
            }
            r => r,
        };
        match place() {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if let Some(parent) = st.dest.parent() {
                    std::fs::DirBuilder::new()
                        .recursive(true)
                        .mode(st.mode | (st.mode & 0o444) >> 2)
                        .create(parent)?;
                }
                place()
            }
            r => r,
        }
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&st.path);
        })
    })
    .await
}

impl Producer {
    pub async fn run(mut self, first: Vec<u8>) {
        match self.pump(first).await {
            Ok(()) => {
                let by_close = self.decoder.by_close();
                let short =
                    |c: &mut CacheOut| by_close && c.declared.is_some_and(|d| d != c.written);
                if let Some(c) = self.cache.take_if(short) {
                    self.abandon_cache(c).await;
                }
                if let Some(c) = self.cache.take() {
                    let held = c.held;
                    if let Err((e, c)) = commit(c, &self.policy).await {
                        self.log.log(
                            Level::Crit,
                            &format!(
                                "cache file \"{}\" could not be stored {}",
                                c.zone.file_path(&c.md5).display(),
                                crate::core::errno_text(&e)
                            ),
                            false,
                        );
                    }
                    if let Some((o, l)) = held {
                        self.pipe.push(Seg::File(o, l));
                    }
                }
                if let Some(st) = self.store.take() {
                    let (from, to) = (st.path.clone(), st.dest.clone());
                    if let Err(e) = commit_store(st, &self.policy).await {
                        self.log.log(
                            Level::Crit,
                            &format!(
                                "rename() \"{}\" to \"{}\" failed {}",
                                from.display(),
                                to.display(),
                                crate::core::errno_text(&e)
                            ),
                            false,
                        );
                    }
                }
                // Bytes after the body make the connection unusable.
                if let Some((up, addr, n)) = self.keep.take().filter(|_| !self.decoder.extra()) {
                    up.put_idle(addr, self.stream, n);
                }
                self.slot.finish();
                self.pipe.finish(Ok(()));
            }
            Err(stop) => {
                if let Some(st) = self.store.take() {
                    let _ = remove(&st.path, &self.policy).await;
                }
                if let Some(c) = self.cache.take() {
                    self.abandon_cache(c).await;
                }
                self.slot.finish();
                if let Stop::Fail(f) = stop {
                    self.log.log(Level::Error, &f.msg, true);
                    self.pipe.finish(Err(f.msg));
                }
            }
        }
    }

    async fn pump(&mut self, first: Vec<u8>) -> Result<(), Stop> {
        self.place(first).await?;
        let mut rbuf = vec![0u8; 64 * 1024];
        let started = std::time::Instant::now();
        let mut read_len = 0u64;
        // nginx reads a buffered body with readv() into its pipe's
        // buffers, an unbuffered one with recv(); its error line says so.
        let call = if self.buffered { "readv()" } else { "recv()" };
        loop {
            // A body found short (also with the head) fails once what
            // came before is placed.
            if let Some(f) = self.decoder.broken() {
                return Err(f.into());
            }
            if self.decoder.done() {
                break;
            }
            let pipe = self.pipe.clone();
            // A response being cached or stored is read whole.
            let caching = self.cache.is_some() || self.store.is_some();
            let mut room = rbuf.len();
            if self.limit_rate > 0 {
                // nginx's pipe: up to rate x (whole seconds since the
                // start + 1) read so far; past that, wait.
                let secs = started.elapsed().as_secs();
                let allowed = self.limit_rate.saturating_mul(secs + 1);
                if read_len >= allowed {
                    // Until the second in which more is allowed.
                    let at = Duration::from_secs(read_len / self.limit_rate);
                    let wait = tokio::time::sleep(at.saturating_sub(started.elapsed()));
                    tokio::select! {
                        () = wait => {}
                        () = gone(&pipe), if !caching => return Err(Stop::Gone),
                    }
                    continue;
                }
                room = room.min((allowed - read_len) as usize);
            }
            let n = tokio::select! {
                r = timed_read(&mut self.stream, &mut rbuf[..room], self.read_timeout, "while reading upstream", false, call) => r?,
                // A client gone is noticed at once, also while upstream is
                // silent; a response being cached is still read whole.
                () = gone(&pipe), if !caching => return Err(Stop::Gone),
            };
            if n == 0 {
                if self.decoder.by_close() {
                    return Ok(());
                }
                return Err(fail(
                    502,
                    "upstream prematurely closed connection while reading upstream",
                    false,
                )
                .into());
            }
            read_len += n as u64;
            self.slot.received(n);
            self.slot.body(n);
            let mut data = Vec::new();
            let extra = self.decoder.extra();
            self.decoder.feed(&rbuf[..n], &mut data)?;
            if let Some(w) = self.decoder.extra_warning().filter(|_| !extra) {
                let msg = format!("{} while reading upstream", w);
                self.log.log(Level::Warn, &msg, true);
            }
            for e in self.decoder.logs() {
                self.log.log(Level::Error, &e, true);
            }
            self.place(data).await?;
        }
        Ok(())
    }

    /// Queues a piece of the body for the client (see [`Producer`]).
    async fn place(&mut self, data: Vec<u8>) -> Result<(), Stop> {
        if data.is_empty() {
            return Ok(());
        }
        let len = data.len() as u64;
        let data = Bytes::from(data);
        if let Some(c) = self.cache.as_mut() {
            let at = c.base + c.written;
            match crate::io::write_at(&c.file, at, data.clone(), &self.policy).await {
                Ok(()) => {
                    c.written += len;
                    if let Some((o, l)) = c.held.replace((at, len)) {
                        self.pipe.push(Seg::File(o, l));
                    }
                    return Ok(());
                }
                Err(e) => self.give_up_cache(&e).await,
            }
        }
        if let Some(st) = self.store.as_mut() {
            match crate::io::write_at(&st.file, st.written, data.clone(), &self.policy).await {
                Ok(()) => {
                    st.written += len;
                    if self.pipe.lock().gone {
                        // As nginx, a body being stored is read whole even
                        // when the client left.
                        return Ok(());
                    }
                }
                Err(e) => {
                    let path = st.path.clone();
                    self.write_failed(&path, &e);
                    self.store = None;
                    let _ = remove(&path, &self.policy).await;
                }
            }
        }
        loop {
            {
                let p = self.pipe.lock();
                if p.gone {
                    return Err(Stop::Gone);
                }
                if p.mem == 0 || p.mem + data.len() <= self.mem_max {
                    drop(p);
                    self.pipe.push(Seg::Mem(data));
                    return Ok(());
                }
            }
            if self.temp_max > 0 && self.temp_len + len <= self.temp_max {
                match self.write_temp(data.clone()).await {
                    Ok(at) => {
                        self.temp_len += len;
                        self.pipe.push(Seg::File(at, len));
                        return Ok(());
                    }
                    Err(e) => {
                        // A full or failing disk: the rest of the body
                        // goes through memory at the client's pace (nginx
                        // ends the response here).
                        let dir = self.temp_dir.clone();
                        self.write_failed(&dir, &e);
                        self.temp_max = 0;
                        continue;
                    }
                }
            }
            // Memory and temp file are full: upstream waits for the client.
            self.pipe.room.notified().await;
        }
    }

    /// Appends to the plain temp file (made on first use); where it went.
    async fn write_temp(&mut self, data: Bytes) -> io::Result<u64> {
        let f = match &self.temp {
            Some(f) => f.clone(),
            None => {
                let f = temp_file(&self.temp_dir, &self.policy).await?;
                self.pipe.lock().file = Some(f.clone());
                self.temp = Some(f.clone());
                f
            }
        };
        let at = self.temp_len;
        crate::io::write_at(&f, at, data, &self.policy).await?;
        Ok(at)
    }

    /// The cache entry could not be written: it is dropped (never
    /// committed, its file removed) and the response goes on uncached.
    /// What the client was already promised is in the entry's file, which
    /// the pipe keeps open, so no temp file may take its place in the pipe.
    async fn give_up_cache(&mut self, e: &io::Error) {
        let Some(c) = self.cache.take() else { return };
        self.write_failed(&c.path, e);
        self.temp_max = 0;
        self.abandon_cache(c).await;
    }

    /// The entry never exists: the client gets all that came (the piece
    /// held back for the commit too), and its file goes.
    async fn abandon_cache(&mut self, c: CacheOut) {
        if let Some((o, l)) = c.held {
            self.pipe.push(Seg::File(o, l));
        }
        let _ = remove(&c.path, &self.policy).await;
    }

    fn write_failed(&self, path: &Path, e: &io::Error) {
        self.log.log(
            Level::Crit,
            &format!(
                "pwrite() \"{}\" failed {}",
                path.display(),
                crate::core::errno_text(e)
            ),
            true,
        );
    }
}

/// Resolves once the consumer has left.
async fn gone(pipe: &Pipe) {
    loop {
        if pipe.lock().gone {
            return;
        }
        pipe.room.notified().await;
    }
}

/// A plain temp file for a body that outgrew PREFIX_buffers, unlinked at
/// once: it goes away with its last descriptor, however the response ends.
async fn temp_file(dir: &Path, policy: &Policy) -> io::Result<Arc<File>> {
    let path = dir.join(format!(
        "tern-proxy-{}-{}",
        std::process::id(),
        TEMP_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let unlinked = || crate::http::body::create(path.clone(), true, policy);
    match unlinked().await {
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied
            ) =>
        {
            cache::prepare_dir(dir).await?;
            unlinked().await
        }
        r => r,
    }
}

/// Completes a cache entry: its header, the rename into place, the node.
async fn commit(mut c: CacheOut, policy: &Policy) -> Result<(), (io::Error, CacheOut)> {
    c.eh.body_len = c.written;
    let head = c.eh.encode();
    if head.len() as u64 != c.base {
        let _ = remove(&c.path, policy).await;
        return Err((io::Error::other("cache header length changed"), c));
    }
    if let Err(e) = crate::io::write_at(&c.file, 0, Bytes::from(head), policy).await {
        let _ = remove(&c.path, policy).await;
        return Err((e, c));
    }
    let (src, dst) = (c.path.clone(), c.zone.file_path(&c.md5));
    if let Err(e) = cache::blocking(policy, move || std::fs::rename(&src, &dst)).await {
        let _ = remove(&c.path, policy).await;
        return Err((e, c));
    }
    c.zone.insert(
        c.md5,
        c.eh.valid_until,
        super::cache::disk_bytes(c.base + c.written),
    );
    if !c.eh.vary.is_empty() {
        let main = cache::md5::digest(&c.eh.key);
        if main != c.md5 {
            c.zone.add_variant(main, c.md5);
        }
    }
    Ok(())
}

pub(super) async fn remove(path: &Path, policy: &Policy) -> io::Result<()> {
    let p = path.to_path_buf();
    cache::blocking(policy, move || std::fs::remove_file(&p)).await
}

static TEMP_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Creates a new temp file (0600), making its directory when missing.
pub(super) async fn create_file(path: PathBuf, policy: &Policy) -> io::Result<Arc<File>> {
    crate::http::body::create(path, false, policy).await
}

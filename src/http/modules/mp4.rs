//! nginx's mp4 module (`ngx_http_mp4_module`): `mp4` in a location makes
//! it the content handler for MP4 files with pseudo-streaming:
//! `?start=SECONDS` and `?end=SECONDS` answer with a file that plays only
//! that part: the `moov` atom's sample tables cut to the samples of the
//! range, chunk offsets moved to where the data now is, and the part of
//! `mdat` those samples sit in.
//!
//! ```text
//! GET/HEAD (else 405); a URI ending in `/` or a directory: the static handler
//! no start/end argument (or an unparsable start): the file as it is
//! else, in the thread pool (the file is read, never on the worker's loop):
//!   top-level atoms: ftyp (copied), moov (read whole, at most
//!     mp4_max_buffer_size when over mp4_buffer_size), mdat (its extent)
//!     [moov before mdat and start=0 without end: the file as it is]
//!   moov: mvhd (duration cut), trak: tkhd (duration cut; a track that ends
//!     before start is left out), mdia: mdhd, hdlr, minf: vmhd|smhd, dinf,
//!     stbl: stsd, stts, stss, ctts, stsc, stsz, stco|co64; other atoms are
//!     not sent
//!   per track: stts -> the first (and last) sample of the range (with
//!     mp4_start_key_frame: back to the key frame before it, and an edit list
//!     that hides the frames up to the start), stss/ctts/stsc/stsz cut to the
//!     same samples, stco|co64 to the same chunks
//!   the data sent: from the smallest start offset of the tracks to the
//!     largest end offset; chunk offsets moved by (new header size - start)
//! 200: ftyp + new moov + mdat header (bytes) + that part of the file
//! ```
//!
//! The file is untrusted input: every read of a table is bounds-checked
//! and every sum checked; a malformed file is answered 500 with nginx's
//! error-log line, never a panic (see the unit test over truncated and
//! garbled files).

use crate::config::registry::{ctx, flag, set_once, size_arg, Args, Setter, Spec};
use crate::config::{ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::http::conf::LocConf;
use crate::http::phases::{Ctx, Step};
use crate::http::response::{Body, Piece, Response};

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "mp4",
        ctx: ctx::LOC,
        args: Args::take(0),
        set: Setter::Loc(set_mp4),
    },
    Spec {
        name: "mp4_buffer_size",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_buffer_size),
    },
    Spec {
        name: "mp4_max_buffer_size",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_max_buffer_size),
    },
    Spec {
        name: "mp4_start_key_frame",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(set_start_key_frame),
    },
];

#[derive(Debug, Clone, Default)]
pub struct Mp4Loc {
    pub on: bool,
    /// `mp4` is in this location itself (a content handler is not passed
    /// on to nested locations).
    pub own: bool,
    pub buffer_size: Option<u64>,
    pub max_buffer_size: Option<u64>,
    pub start_key_frame: Option<bool>,
}

impl Mp4Loc {
    pub fn merge(&mut self, p: &Mp4Loc) {
        self.on |= p.on;
        crate::http::conf::merge_opts!(self, p; buffer_size, max_buffer_size, start_key_frame);
    }

    pub fn drop_inherited(&mut self) {
        if !self.own {
            self.on = false;
        }
    }
}

fn set_mp4(l: &mut LocConf, _: &Directive, _: &mut Compiler) -> ConfResult<()> {
    l.modules.mp4.on = true;
    l.modules.mp4.own = true;
    Ok(())
}

fn set_buffer_size(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = size_arg(d, 0)?;
    set_once(&mut l.modules.mp4.buffer_size, v, d)
}

fn set_max_buffer_size(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = size_arg(d, 0)?;
    set_once(&mut l.modules.mp4.max_buffer_size, v, d)
}

fn set_start_key_frame(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut l.modules.mp4.start_key_frame, v, d)
}

/// nginx's ngx_http_mp4_atofp: SECONDS[.FRACTION] as milliseconds, digits
/// past the third decimal ignored; None for anything else.
pub(crate) fn atofp(v: &[u8]) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    let mut value: u64 = 0;
    let mut point = 3u32;
    let mut dot = false;
    for &c in v {
        if c == b'.' {
            if dot {
                return None;
            }
            dot = true;
            continue;
        }
        if !c.is_ascii_digit() {
            return None;
        }
        if point == 0 {
            continue;
        }
        value = value.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
        if dot {
            point -= 1;
        }
    }
    for _ in 0..point {
        value = value.checked_mul(10)?;
    }
    (value <= i64::MAX as u64).then_some(value)
}

/// The content handler of a location with `mp4`; None to fall through.
pub async fn content(cx: &mut Ctx<'_>) -> Option<Step> {
    if !cx.loc.modules.mp4.on {
        return None;
    }
    let super::static_file::HandlerFile { path, file, policy } =
        match super::static_file::open_for_handler(cx).await? {
            Ok(f) => f,
            Err(step) => return Some(step),
        };
    let args = cx.args.as_deref().unwrap_or(b"");
    let mut start: Option<u64> = None;
    let mut length = 0u64;
    if !args.is_empty() {
        if let Some(v) = crate::http::uri::arg(args, b"start") {
            start = atofp(v);
        }
        if let Some(end) = crate::http::uri::arg(args, b"end").and_then(atofp) {
            if end > 0 {
                let s = *start.get_or_insert(0);
                if end > s {
                    length = end - s;
                }
            }
        }
    }
    let mut r = super::static_file::file_response(cx, &path, file.clone(), policy);
    r.headers.push(("Accept-Ranges".into(), b"bytes".to_vec()));
    let Some(start) = start else {
        return Some(Step::Done(r));
    };
    r.single_range = true;
    let conf = &cx.loc.modules.mp4;
    let params = Params {
        start,
        length,
        buffer_size: conf.buffer_size.unwrap_or(512 * 1024),
        max_buffer_size: conf.max_buffer_size.unwrap_or(10 * 1024 * 1024),
        start_key_frame: conf.start_key_frame.unwrap_or(false),
    };
    let name = String::from_utf8_lossy(&path).into_owned();
    let size = file.meta.size;
    let src = file.clone();
    let done = run(cx, move || {
        let reader = FileSource(&src.file);
        process(&reader, size, &params, &name)
    })
    .await;
    match done {
        Ok(Outcome::Whole) => {}
        Ok(Outcome::Cut(out)) => {
            let len = out.header.len() as u64 + out.data_len;
            r.content_length = Some(len);
            super::static_file::set_etag_len(cx, &mut r, file.meta.mtime, len);
            let mut pieces = vec![Piece::Bytes(out.header)];
            if out.data_len > 0 {
                pieces.push(Piece::File {
                    file,
                    offset: out.data_start,
                    len: out.data_len,
                });
            }
            r.body = Body::Multi(pieces);
        }
        Err(Fail { level, msg }) => {
            if let Some(m) = msg {
                cx.log(level, &m);
            }
            return Some(Step::done(Response::status(500)));
        }
    }
    Some(Step::Done(r))
}

/// Runs the parse in the location's pool (else the `default` pool).
async fn run<F>(cx: &Ctx<'_>, job: F) -> Result<Outcome, Fail>
where
    F: FnOnce() -> Result<Outcome, Fail> + Send + 'static,
{
    let pool = match cx.io_policy() {
        Ok(p) => match &p.aio {
            crate::io::Aio::Threads(pool) => Some(pool.clone()),
            crate::io::Aio::Uring | crate::io::Aio::Off => None,
        },
        Err(_) => None,
    }
    .or_else(|| cx.shared.pools.load().get(crate::io::DEFAULT_POOL));
    let Some(pool) = pool else {
        return Err(Fail::err("thread pool \"default\" not found".into()));
    };
    match pool.run(job).await {
        Ok(r) => r,
        Err(e) => Err(Fail::err(e.to_string())),
    }
}

// ---- the parser ------------------------------------------------------------

/// What a request asks for.
#[derive(Debug, Clone)]
pub(crate) struct Params {
    /// Milliseconds.
    pub start: u64,
    /// Milliseconds from start; 0: to the end.
    pub length: u64,
    pub buffer_size: u64,
    pub max_buffer_size: u64,
    pub start_key_frame: bool,
}

/// A failure: the line to log (None: nothing), answered 500.
#[derive(Debug)]
pub(crate) struct Fail {
    level: Level,
    msg: Option<String>,
}

impl Fail {
    fn err(msg: String) -> Fail {
        Fail {
            level: Level::Error,
            msg: Some(msg),
        }
    }
}

#[derive(Debug)]
pub(crate) enum Outcome {
    /// Send the file as it is.
    Whole,
    Cut(Cut),
}

#[derive(Debug)]
pub(crate) struct Cut {
    /// ftyp + moov + mdat header.
    pub header: Vec<u8>,
    pub data_start: u64,
    pub data_len: u64,
}

/// Where the bytes come from (a file; a slice in the tests).
pub(crate) trait Source {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize>;
}

struct FileSource<'a>(&'a std::fs::File);

impl Source for FileSource<'_> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        std::os::unix::fs::FileExt::read_at(self.0, buf, offset)
    }
}

/// Bytes in memory as the file (the tests and the fuzz target).
pub(crate) struct Slice<'a>(pub &'a [u8]);

impl Source for Slice<'_> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        let d = self.0;
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(d.len());
        let n = buf.len().min(d.len() - start);
        buf[..n].copy_from_slice(&d[start..start + n]);
        Ok(n)
    }
}

/// Reads exactly `len` bytes at `offset`.
fn read_exact(src: &dyn Source, offset: u64, len: usize, name: &str) -> Result<Vec<u8>, Fail> {
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match src.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(Fail {
                    level: Level::Crit,
                    msg: Some(format!(
                        "pread() \"{}\" failed {}",
                        name,
                        crate::core::errno_text(&e)
                    )),
                })
            }
        }
    }
    if got != len {
        return Err(Fail {
            level: Level::Crit,
            msg: Some(format!(
                "pread() read only {} of {} from \"{}\"",
                got, len, name
            )),
        });
    }
    Ok(buf)
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
}

fn be64(b: &[u8], at: usize) -> Option<u64> {
    let s = b.get(at..at.checked_add(8)?)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Some(u64::from_be_bytes(a))
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    if let Some(s) = b.get_mut(at..at + 4) {
        s.copy_from_slice(&v.to_be_bytes());
    }
}

fn put64(b: &mut [u8], at: usize, v: u64) {
    if let Some(s) = b.get_mut(at..at + 8) {
        s.copy_from_slice(&v.to_be_bytes());
    }
}

/// One track being cut (nginx's ngx_http_mp4_trak_t).
#[derive(Debug, Default)]
struct Trak {
    tkhd: Option<Vec<u8>>,
    mdhd: Option<Vec<u8>>,
    hdlr: Option<Vec<u8>>,
    vmhd: Option<Vec<u8>>,
    smhd: Option<Vec<u8>>,
    dinf: Option<Vec<u8>>,
    stsd: Option<Vec<u8>>,
    /// Version and flags of each table atom, and its entries (a range
    /// `pos..last` of them is sent).
    stts: Option<Table<(u32, u32)>>,
    stss: Option<Table<u32>>,
    ctts: Option<Table<(u32, u32)>>,
    stsc: Option<Table<(u32, u32, u32)>>,
    stsc_start: Option<(u32, u32, u32)>,
    stsc_end: Option<(u32, u32, u32)>,
    /// A whole stsz atom with one size for all samples (sent as it is).
    stsz_uniform: Option<Vec<u8>>,
    stsz: Option<Table<u32>>,
    stco: Option<Table<u64>>,
    co64: bool,
    stsz_seen: bool,

    timescale: u32,
    time_to_sample_entries: u64,
    sample_to_chunk_entries: u64,
    sync_samples_entries: u64,
    composition_offset_entries: u64,
    sample_sizes_entries: u64,
    chunks: u64,

    start_sample: u64,
    end_sample: u64,
    start_chunk: u64,
    end_chunk: u64,
    start_chunk_samples: u64,
    end_chunk_samples: u64,
    start_chunk_samples_size: u64,
    end_chunk_samples_size: u64,
    duration: u64,
    prefix: u64,
    movie_duration: u64,
    start_offset: u64,
    end_offset: u64,
    size: u64,
}

#[derive(Debug, Clone)]
struct Table<T> {
    vf: [u8; 4],
    e: Vec<T>,
    pos: usize,
    last: usize,
}

impl<T> Table<T> {
    fn new(vf: [u8; 4], e: Vec<T>) -> Table<T> {
        let last = e.len();
        Table {
            vf,
            e,
            pos: 0,
            last,
        }
    }
}

struct Mp4<'a> {
    name: &'a str,
    p: &'a Params,
    end: u64,
    timescale: u32,
    ftyp: Option<Vec<u8>>,
    moov_seen: bool,
    mvhd: Option<Vec<u8>>,
    traks: Vec<Trak>,
    mdat: Option<u64>,
    /// mdat's data: first byte and end.
    mdat_last: u64,
}

type R<T> = Result<T, Fail>;

/// What an atom handler tells its caller.
enum Flow {
    Ok,
    /// nginx's NGX_DECLINED: the track is left out, or (moov) the file is
    /// sent whole.
    Declined,
}

impl Mp4<'_> {
    fn fail(&self, msg: String) -> Fail {
        Fail::err(msg)
    }

    fn too_small(&self, atom: &str) -> Fail {
        self.fail(format!("\"{}\" mp4 {} atom too small", self.name, atom))
    }

    fn dup(&self, atom: &str) -> Fail {
        self.fail(format!("duplicate mp4 {} atom in \"{}\"", atom, self.name))
    }

    /// Time in ms to a track's or the movie's units.
    fn units(ms: u64, timescale: u32) -> u64 {
        ((u128::from(ms) * u128::from(timescale)) / 1000).min(u128::from(u64::MAX)) as u64
    }
}

/// A child atom found in a buffer: name, data range.
struct Atom {
    name: [u8; 4],
    data: std::ops::Range<usize>,
}

/// The atoms in `buf[from..to]` in order (nginx's read_atom on a buffer):
/// a zero size ends the level; a size below the header, or past the
/// parent's end, is an error.
fn children(mp4: &Mp4<'_>, buf: &[u8], from: usize, to: usize) -> R<Vec<Atom>> {
    let mut out = Vec::new();
    let mut off = from;
    while off < to {
        let Some(size32) = be32(buf, off).filter(|_| off + 8 <= to) else {
            return Err(mp4.fail(format!("\"{}\" mp4 file truncated", mp4.name)));
        };
        let (size, hdr) = match size32 {
            0 => break,
            1 => {
                let Some(s) = be64(buf, off + 8).filter(|_| off + 16 <= to) else {
                    return Err(mp4.fail(format!("\"{}\" mp4 file truncated", mp4.name)));
                };
                if s < 16 {
                    return Err(mp4.fail(format!("\"{}\" mp4 atom is too small:{}", mp4.name, s)));
                }
                (s, 16)
            }
            s if s < 8 => {
                return Err(mp4.fail(format!("\"{}\" mp4 atom is too small:{}", mp4.name, s)));
            }
            s => (u64::from(s), 8),
        };
        if size > (to - off) as u64 {
            return Err(mp4.fail(format!("\"{}\" mp4 atom too large:{}", mp4.name, size)));
        }
        let size = size as usize;
        let mut name = [0u8; 4];
        name.copy_from_slice(&buf[off + 4..off + 8]);
        out.push(Atom {
            name,
            data: off + hdr..off + size,
        });
        off += size;
    }
    Ok(out)
}

/// The whole cut: nginx's ngx_http_mp4_process.
pub(crate) fn process(src: &dyn Source, end: u64, p: &Params, name: &str) -> Result<Outcome, Fail> {
    let mut mp4 = Mp4 {
        name,
        p,
        end,
        timescale: 0,
        ftyp: None,
        moov_seen: false,
        mvhd: None,
        traks: Vec::new(),
        mdat: None,
        mdat_last: 0,
    };
    // Top-level atoms, read from the file.
    let mut off = 0u64;
    while off < end {
        let remain = end - off;
        if remain < 4 {
            return Err(mp4.fail(format!("\"{}\" mp4 file truncated", name)));
        }
        let head = read_exact(src, off, remain.min(16) as usize, name)?;
        let size32 = be32(&head, 0).unwrap_or(0);
        if size32 == 0 {
            break;
        }
        let (size, hdr) = if size32 == 1 {
            let Some(s) = be64(&head, 8) else {
                return Err(mp4.fail(format!("\"{}\" mp4 file truncated", name)));
            };
            if s < 16 {
                return Err(mp4.fail(format!("\"{}\" mp4 atom is too small:{}", name, s)));
            }
            (s, 16u64)
        } else if size32 < 8 {
            return Err(mp4.fail(format!("\"{}\" mp4 atom is too small:{}", name, size32)));
        } else {
            if head.len() < 8 {
                return Err(mp4.fail(format!("\"{}\" mp4 file truncated", name)));
            }
            (u64::from(size32), 8u64)
        };
        if size > remain {
            return Err(mp4.fail(format!("\"{}\" mp4 atom too large:{}", name, size)));
        }
        let data_size = size - hdr;
        let data_off = off + hdr;
        match &head[4..8] {
            b"ftyp" => {
                if data_size > 1024 {
                    return Err(mp4.fail(format!(
                        "\"{}\" mp4 ftyp atom is too large:{}",
                        name, data_size
                    )));
                }
                if mp4.ftyp.is_some() {
                    return Err(mp4.dup("ftyp"));
                }
                let data = read_exact(src, data_off, data_size as usize, name)?;
                let mut a = Vec::with_capacity(8 + data.len());
                a.extend_from_slice(&(8 + data.len() as u32).to_be_bytes());
                a.extend_from_slice(b"ftyp");
                a.extend_from_slice(&data);
                mp4.ftyp = Some(a);
            }
            b"moov" => {
                let no_mdat = mp4.mdat.is_none();
                if no_mdat && p.start == 0 && p.length == 0 {
                    // The file as it is: moov comes first and the whole
                    // of it is asked for.
                    return Ok(Outcome::Whole);
                }
                if mp4.moov_seen {
                    return Err(mp4.dup("moov"));
                }
                if data_size > p.buffer_size && data_size > p.max_buffer_size {
                    return Err(mp4.fail(format!(
                        "\"{}\" mp4 moov atom is too large:{}, you may want to increase mp4_max_buffer_size",
                        name, data_size
                    )));
                }
                let Ok(len) = usize::try_from(data_size) else {
                    return Err(mp4.fail(format!("\"{}\" mp4 atom too large:{}", name, size)));
                };
                let moov = read_exact(src, data_off, len, name)?;
                mp4.moov_seen = true;
                if let Flow::Declined = read_moov(&mut mp4, &moov)? {
                    return Ok(Outcome::Whole);
                }
                if !no_mdat {
                    break;
                }
            }
            b"mdat" => {
                if mp4.mdat.is_some() {
                    return Err(mp4.dup("mdat"));
                }
                mp4.mdat = Some(data_off);
                mp4.mdat_last = data_off + data_size;
                if !mp4.traks.is_empty() {
                    break;
                }
            }
            _ => {}
        }
        off += size;
    }
    finish(mp4)
}

fn read_moov(mp4: &mut Mp4<'_>, moov: &[u8]) -> R<Flow> {
    for a in children(mp4, moov, 0, moov.len())? {
        let data = &moov[a.data.clone()];
        match &a.name {
            b"mvhd" => read_mvhd(mp4, data)?,
            b"trak" => {
                mp4.traks.push(Trak::default());
                match read_trak(mp4, moov, a.data.clone())? {
                    Flow::Ok => {}
                    Flow::Declined => {
                        mp4.traks.pop();
                    }
                }
            }
            b"cmov" => {
                return Err(mp4.fail(format!(
                    "\"{}\" mp4 compressed moov atom (cmov) is not supported",
                    mp4.name
                )))
            }
            _ => {}
        }
    }
    Ok(Flow::Ok)
}

/// The atom's bytes with a fresh 8-byte header (`name`, the data's size).
fn atom_bytes(name: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut a = Vec::with_capacity(8 + data.len());
    a.extend_from_slice(&((8 + data.len()) as u32).to_be_bytes());
    a.extend_from_slice(name);
    a.extend_from_slice(data);
    a
}

fn read_mvhd(mp4: &mut Mp4<'_>, data: &[u8]) -> R<()> {
    if mp4.mvhd.is_some() {
        return Err(mp4.dup("mvhd"));
    }
    if data.len() < 100 {
        return Err(mp4.too_small("mvhd"));
    }
    let v1 = data[0] != 0;
    if v1 && data.len() < 112 {
        return Err(mp4.too_small("mvhd"));
    }
    let mut a = atom_bytes(b"mvhd", data);
    let (timescale, duration) = if v1 {
        (be32(&a, 28).unwrap_or(0), be64(&a, 32).unwrap_or(0))
    } else {
        (
            be32(&a, 20).unwrap_or(0),
            u64::from(be32(&a, 24).unwrap_or(0)),
        )
    };
    mp4.timescale = timescale;
    let start_time = Mp4::units(mp4.p.start, timescale);
    if duration < start_time {
        return Err(mp4.fail(format!(
            "\"{}\" mp4 start time exceeds file duration",
            mp4.name
        )));
    }
    let mut duration = duration - start_time;
    if mp4.p.length > 0 {
        duration = duration.min(Mp4::units(mp4.p.length, timescale));
    }
    if v1 {
        put64(&mut a, 32, duration);
    } else {
        put32(&mut a, 24, duration as u32);
    }
    mp4.mvhd = Some(a);
    Ok(())
}

fn last<'m>(mp4: &'m mut Mp4<'_>) -> &'m mut Trak {
    if mp4.traks.is_empty() {
        mp4.traks.push(Trak::default());
    }
    let n = mp4.traks.len() - 1;
    &mut mp4.traks[n]
}

fn read_trak(mp4: &mut Mp4<'_>, moov: &[u8], range: std::ops::Range<usize>) -> R<Flow> {
    let mut seen_mdia = false;
    for a in children(mp4, moov, range.start, range.end)? {
        let data = &moov[a.data.clone()];
        match &a.name {
            b"tkhd" => {
                if let Flow::Declined = read_tkhd(mp4, data)? {
                    return Ok(Flow::Declined);
                }
            }
            b"mdia" => {
                if seen_mdia {
                    return Err(mp4.dup("mdia"));
                }
                seen_mdia = true;
                for b in children(mp4, moov, a.data.start, a.data.end)? {
                    let d = &moov[b.data.clone()];
                    match &b.name {
                        b"mdhd" => {
                            if let Flow::Declined = read_mdhd(mp4, d)? {
                                return Ok(Flow::Declined);
                            }
                        }
                        b"hdlr" => {
                            if last(mp4).hdlr.is_some() {
                                return Err(mp4.dup("hdlr"));
                            }
                            last(mp4).hdlr = Some(atom_bytes(b"hdlr", d));
                        }
                        b"minf" => read_minf(mp4, moov, b.data.clone())?,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Ok(Flow::Ok)
}

fn read_tkhd(mp4: &mut Mp4<'_>, data: &[u8]) -> R<Flow> {
    if data.len() < 84 {
        return Err(mp4.too_small("tkhd"));
    }
    let v1 = data[0] != 0;
    if v1 && data.len() < 96 {
        return Err(mp4.too_small("tkhd"));
    }
    let mut a = atom_bytes(b"tkhd", data);
    let duration = if v1 {
        be64(&a, 36).unwrap_or(0)
    } else {
        u64::from(be32(&a, 28).unwrap_or(0))
    };
    let start_time = Mp4::units(mp4.p.start, mp4.timescale);
    if duration <= start_time {
        return Ok(Flow::Declined);
    }
    let mut duration = duration - start_time;
    if mp4.p.length > 0 {
        duration = duration.min(Mp4::units(mp4.p.length, mp4.timescale));
    }
    if last(mp4).tkhd.is_some() {
        return Err(mp4.dup("tkhd"));
    }
    if v1 {
        put64(&mut a, 36, duration);
    } else {
        put32(&mut a, 28, duration as u32);
    }
    let t = last(mp4);
    t.movie_duration = duration;
    t.tkhd = Some(a);
    Ok(Flow::Ok)
}

fn read_mdhd(mp4: &mut Mp4<'_>, data: &[u8]) -> R<Flow> {
    if data.len() < 24 {
        return Err(mp4.too_small("mdhd"));
    }
    let v1 = data[0] != 0;
    if v1 && data.len() < 36 {
        return Err(mp4.too_small("mdhd"));
    }
    let a = atom_bytes(b"mdhd", data);
    let (timescale, duration) = if v1 {
        (be32(&a, 28).unwrap_or(0), be64(&a, 32).unwrap_or(0))
    } else {
        (
            be32(&a, 20).unwrap_or(0),
            u64::from(be32(&a, 24).unwrap_or(0)),
        )
    };
    let start_time = Mp4::units(mp4.p.start, timescale);
    if duration <= start_time {
        return Ok(Flow::Declined);
    }
    let mut duration = duration - start_time;
    if mp4.p.length > 0 {
        duration = duration.min(Mp4::units(mp4.p.length, timescale));
    }
    if last(mp4).mdhd.is_some() {
        return Err(mp4.dup("mdhd"));
    }
    let t = last(mp4);
    t.timescale = timescale;
    t.duration = duration;
    t.mdhd = Some(a);
    Ok(Flow::Ok)
}

fn read_minf(mp4: &mut Mp4<'_>, moov: &[u8], range: std::ops::Range<usize>) -> R<()> {
    for a in children(mp4, moov, range.start, range.end)? {
        let d = &moov[a.data.clone()];
        match &a.name {
            b"vmhd" | b"smhd" => {
                let t = last(mp4);
                if t.vmhd.is_some() || t.smhd.is_some() {
                    return Err(mp4.dup("vmhd/smhd"));
                }
                let bytes = atom_bytes(&a.name, d);
                let t = last(mp4);
                if &a.name == b"vmhd" {
                    t.vmhd = Some(bytes);
                } else {
                    t.smhd = Some(bytes);
                }
            }
            b"dinf" => {
                if last(mp4).dinf.is_some() {
                    return Err(mp4.dup("dinf"));
                }
                last(mp4).dinf = Some(atom_bytes(b"dinf", d));
            }
            b"stbl" => {
                for b in children(mp4, moov, a.data.start, a.data.end)? {
                    read_stbl_child(mp4, &b.name, &moov[b.data.clone()])?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// A table atom: version/flags, the entry count and the entries, checked
/// against the atom's size.
fn table<T>(
    mp4: &Mp4<'_>,
    data: &[u8],
    what: &str,
    head: usize,
    entry: usize,
    get: impl Fn(&[u8]) -> T,
) -> R<(Table<T>, u64)> {
    if data.len() < head {
        return Err(mp4.too_small(what));
    }
    let entries = u64::from(be32(data, head - 4).unwrap_or(0));
    let need = entries
        .checked_mul(entry as u64)
        .and_then(|n| n.checked_add(head as u64));
    if need.is_none_or(|n| n > data.len() as u64) {
        return Err(mp4.too_small(what));
    }
    let mut vf = [0u8; 4];
    vf.copy_from_slice(&data[..4]);
    let e: Vec<T> = data[head..head + entries as usize * entry]
        .chunks_exact(entry)
        .map(get)
        .collect();
    Ok((Table::new(vf, e), entries))
}

fn read_stbl_child(mp4: &mut Mp4<'_>, name: &[u8; 4], d: &[u8]) -> R<()> {
    let u32_at = |b: &[u8], i: usize| be32(b, i).unwrap_or(0);
    match name {
        b"stsd" => {
            if d.len() < 16 {
                return Err(mp4.too_small("stsd"));
            }
            if last(mp4).stsd.is_some() {
                return Err(mp4.dup("stsd"));
            }
            last(mp4).stsd = Some(atom_bytes(b"stsd", d));
        }
        b"stts" => {
            let (tb, n) = table(mp4, d, "stts", 8, 8, |e| (u32_at(e, 0), u32_at(e, 4)))?;
            if last(mp4).stts.is_some() {
                return Err(mp4.dup("stts"));
            }
            let t = last(mp4);
            t.time_to_sample_entries = n;
            t.stts = Some(tb);
        }
        b"stss" => {
            if d.len() < 8 {
                return Err(mp4.too_small("stss"));
            }
            if last(mp4).stss.is_some() {
                return Err(mp4.dup("stss"));
            }
            let (tb, n) = table(mp4, d, "stss", 8, 4, |e| u32_at(e, 0))?;
            let t = last(mp4);
            t.sync_samples_entries = n;
            t.stss = Some(tb);
        }
        b"ctts" => {
            if d.len() < 8 {
                return Err(mp4.too_small("ctts"));
            }
            if last(mp4).ctts.is_some() {
                return Err(mp4.dup("ctts"));
            }
            let (tb, n) = table(mp4, d, "ctts", 8, 8, |e| (u32_at(e, 0), u32_at(e, 4)))?;
            let t = last(mp4);
            t.composition_offset_entries = n;
            t.ctts = Some(tb);
        }
        b"stsc" => {
            let (tb, n) = table(mp4, d, "stsc", 8, 12, |e| {
                (u32_at(e, 0), u32_at(e, 4), u32_at(e, 8))
            })?;
            if last(mp4).stsc.is_some() {
                return Err(mp4.dup("stsc"));
            }
            let t = last(mp4);
            t.sample_to_chunk_entries = n;
            t.stsc = Some(tb);
        }
        b"stsz" => {
            if d.len() < 12 {
                return Err(mp4.too_small("stsz"));
            }
            let uniform = u32_at(d, 4);
            let entries = u64::from(u32_at(d, 8));
            if last(mp4).stsz_seen {
                return Err(mp4.dup("stsz"));
            }
            last(mp4).stsz_seen = true;
            last(mp4).sample_sizes_entries = entries;
            if uniform == 0 {
                let (tb, _) = table(mp4, d, "stsz", 12, 4, |e| u32_at(e, 0))?;
                last(mp4).stsz = Some(tb);
            } else {
                last(mp4).stsz_uniform = Some(atom_bytes(b"stsz", d));
            }
        }
        b"stco" | b"co64" => {
            let co64 = name == b"co64";
            let what = if co64 { "co64" } else { "stco" };
            let (tb, n) = if co64 {
                table(mp4, d, what, 8, 8, |e| be64(e, 0).unwrap_or(0))?
            } else {
                table(mp4, d, what, 8, 4, |e| u64::from(u32_at(e, 0)))?
            };
            if last(mp4).stco.is_some() {
                return Err(mp4.dup("stco/co64"));
            }
            let t = last(mp4);
            t.chunks = n;
            t.co64 = co64;
            t.stco = Some(tb);
        }
        _ => {}
    }
    Ok(())
}

// ---- cutting the tables -------------------------------------------------------

fn finish(mut mp4: Mp4<'_>) -> Result<Outcome, Fail> {
    let name = mp4.name;
    if mp4.traks.is_empty() {
        return Err(mp4.fail(format!("no mp4 trak atoms were found in \"{}\"", name)));
    }
    if mp4.mdat.is_none() {
        return Err(mp4.fail(format!("no mp4 mdat atom was found in \"{}\"", name)));
    }
    let ftyp = mp4.ftyp.take();
    let mvhd = mp4.mvhd.take();
    let mut traks = std::mem::take(&mut mp4.traks);
    let ctx = &mp4;
    let mut moov_size: u64 = mvhd.as_ref().map_or(0, |m| m.len() as u64);
    let mut start_offset = ctx.end;
    let mut end_offset = 0u64;
    for t in traks.iter_mut() {
        update_stts(ctx, t)?;
        update_stss(ctx, t);
        update_ctts(ctx, t);
        update_stsc(ctx, t)?;
        update_stsz(ctx, t)?;
        update_stco(ctx, t)?;
        if let Some(m) = t.mdhd.as_mut() {
            if m.get(8) == Some(&0) {
                put32(m, 24, t.duration as u32);
            } else {
                put64(m, 32, t.duration);
            }
        }
        t.size = Sizes::of(t).trak;
        moov_size += t.size;
        start_offset = start_offset.min(t.start_offset);
        end_offset = end_offset.max(t.end_offset);
    }
    if end_offset < start_offset {
        end_offset = start_offset;
    }
    moov_size += 8;
    if start_offset > ctx.mdat_last {
        return Err(ctx.fail(format!("start time is out mp4 mdat atom in \"{}\"", name)));
    }
    let data_len = end_offset - start_offset;
    let mut mdat_header = Vec::with_capacity(16);
    if data_len > 0xffff_ffff - 8 {
        mdat_header.extend_from_slice(&1u32.to_be_bytes());
        mdat_header.extend_from_slice(b"mdat");
        mdat_header.extend_from_slice(&(16 + data_len).to_be_bytes());
    } else {
        mdat_header.extend_from_slice(&((8 + data_len) as u32).to_be_bytes());
        mdat_header.extend_from_slice(b"mdat");
    }
    let ftyp_size = ftyp.as_ref().map_or(0, |f| f.len() as u64);
    // Chunk offsets move by what now comes before the data.
    let adjustment = (ftyp_size + moov_size + mdat_header.len() as u64).wrapping_sub(start_offset);
    let Ok(moov_u32) = u32::try_from(moov_size) else {
        return Err(ctx.fail(format!(
            "\"{}\" mp4 moov atom is too large:{}",
            name, moov_size
        )));
    };
    let mut out = Vec::with_capacity((ftyp_size + moov_size) as usize + mdat_header.len());
    if let Some(f) = &ftyp {
        out.extend_from_slice(f);
    }
    out.extend_from_slice(&moov_u32.to_be_bytes());
    out.extend_from_slice(b"moov");
    if let Some(m) = &mvhd {
        out.extend_from_slice(m);
    }
    for t in &traks {
        write_trak(&mut out, t, adjustment);
    }
    out.extend_from_slice(&mdat_header);
    Ok(Outcome::Cut(Cut {
        header: out,
        data_start: start_offset,
        data_len,
    }))
}

fn hdr(out: &mut Vec<u8>, size: u64, name: &[u8; 4]) {
    out.extend_from_slice(&(size as u32).to_be_bytes());
    out.extend_from_slice(name);
}

/// The sizes of a cut track's atoms, from the inside out, as nginx adds
/// them up.
struct Sizes {
    stts: u64,
    stss: u64,
    ctts: u64,
    stsc: u64,
    stsz: u64,
    stco: u64,
    stbl: u64,
    minf: u64,
    mdia: u64,
    trak: u64,
}

impl Sizes {
    fn of(t: &Trak) -> Sizes {
        let len = |a: &Option<Vec<u8>>| a.as_ref().map_or(0, |a| a.len() as u64);
        let n = |pos: usize, last: usize| last.saturating_sub(pos) as u64;
        let stts = t.stts.as_ref().map_or(0, |s| 16 + 8 * n(s.pos, s.last));
        let stss = t.stss.as_ref().map_or(0, |s| 16 + 4 * n(s.pos, s.last));
        let ctts = t.ctts.as_ref().map_or(0, |c| 16 + 8 * n(c.pos, c.last));
        let stsc = 16 + 12 * t.sample_to_chunk_entries;
        let stsz = t.stsz.as_ref().map_or(0, |s| 20 + 4 * n(s.pos, s.last));
        let width = if t.co64 { 8 } else { 4 };
        let stco = t.stco.as_ref().map_or(0, |s| 16 + width * n(s.pos, s.last));
        let stbl =
            8 + len(&t.stsd) + len(&t.stsz_uniform) + stts + stss + ctts + stsc + stsz + stco;
        let minf = stbl + 8 + len(&t.vmhd) + len(&t.smhd) + len(&t.dinf);
        let mdia = minf + len(&t.mdhd) + len(&t.hdlr) + 8;
        let edts = if t.prefix != 0 { 44 } else { 0 };
        let trak = mdia + len(&t.tkhd) + edts + 8;
        Sizes {
            stts,
            stss,
            ctts,
            stsc,
            stsz,
            stco,
            stbl,
            minf,
            mdia,
            trak,
        }
    }
}

/// A track's atoms in nginx's order.
fn write_trak(out: &mut Vec<u8>, t: &Trak, adjustment: u64) {
    let Sizes {
        stts: stts_size,
        stss: stss_size,
        ctts: ctts_size,
        stsc: stsc_size,
        stsz: stsz_size,
        stco: stco_size,
        stbl,
        minf,
        mdia,
        trak,
    } = Sizes::of(t);
    hdr(out, trak, b"trak");
    if let Some(a) = &t.tkhd {
        out.extend_from_slice(a);
    }
    if t.prefix != 0 {
        hdr(out, 44, b"edts");
        hdr(out, 36, b"elst");
        out.extend_from_slice(&[1, 0, 0, 0]);
        out.extend_from_slice(&1u32.to_be_bytes());
        out.extend_from_slice(&t.movie_duration.to_be_bytes());
        out.extend_from_slice(&t.prefix.to_be_bytes());
        out.extend_from_slice(&1u16.to_be_bytes());
        out.extend_from_slice(&0u16.to_be_bytes());
    }
    hdr(out, mdia, b"mdia");
    for a in [&t.mdhd, &t.hdlr].into_iter().flatten() {
        out.extend_from_slice(a);
    }
    hdr(out, minf, b"minf");
    for a in [&t.vmhd, &t.smhd, &t.dinf].into_iter().flatten() {
        out.extend_from_slice(a);
    }
    hdr(out, stbl, b"stbl");
    if let Some(a) = &t.stsd {
        out.extend_from_slice(a);
    }
    if let Some(s) = &t.stts {
        hdr(out, stts_size, b"stts");
        out.extend_from_slice(&s.vf);
        out.extend_from_slice(&(t.time_to_sample_entries as u32).to_be_bytes());
        for (c, d) in s.e.get(s.pos..s.last).unwrap_or(&[]) {
            out.extend_from_slice(&c.to_be_bytes());
            out.extend_from_slice(&d.to_be_bytes());
        }
    }
    if let Some(s) = &t.stss {
        hdr(out, stss_size, b"stss");
        out.extend_from_slice(&s.vf);
        out.extend_from_slice(&(t.sync_samples_entries as u32).to_be_bytes());
        if t.sync_samples_entries > 0 {
            for v in s.e.get(s.pos..s.last).unwrap_or(&[]) {
                out.extend_from_slice(&v.wrapping_sub(t.start_sample as u32).to_be_bytes());
            }
        }
    }
    if let Some(c) = &t.ctts {
        hdr(out, ctts_size, b"ctts");
        out.extend_from_slice(&c.vf);
        out.extend_from_slice(&(t.composition_offset_entries as u32).to_be_bytes());
        for (n, o) in c.e.get(c.pos..c.last).unwrap_or(&[]) {
            out.extend_from_slice(&n.to_be_bytes());
            out.extend_from_slice(&o.to_be_bytes());
        }
    }
    if let Some(s) = &t.stsc {
        hdr(out, stsc_size, b"stsc");
        out.extend_from_slice(&s.vf);
        out.extend_from_slice(&(t.sample_to_chunk_entries as u32).to_be_bytes());
        let mut entry = |e: &(u32, u32, u32)| {
            out.extend_from_slice(&e.0.to_be_bytes());
            out.extend_from_slice(&e.1.to_be_bytes());
            out.extend_from_slice(&e.2.to_be_bytes());
        };
        if let Some(e) = &t.stsc_start {
            entry(e);
        }
        for e in s.e.get(s.pos..s.last).unwrap_or(&[]) {
            entry(&(e.0.wrapping_sub(t.start_chunk as u32), e.1, e.2));
        }
        if let Some(e) = &t.stsc_end {
            entry(e);
        }
    }
    if let Some(a) = &t.stsz_uniform {
        out.extend_from_slice(a);
    }
    if let Some(s) = &t.stsz {
        let n = s.last.saturating_sub(s.pos);
        hdr(out, stsz_size, b"stsz");
        out.extend_from_slice(&s.vf);
        out.extend_from_slice(&0u32.to_be_bytes());
        out.extend_from_slice(&(n as u32).to_be_bytes());
        for v in s.e.get(s.pos..s.last).unwrap_or(&[]) {
            out.extend_from_slice(&v.to_be_bytes());
        }
    }
    if let Some(s) = &t.stco {
        hdr(out, stco_size, if t.co64 { b"co64" } else { b"stco" });
        out.extend_from_slice(&s.vf);
        out.extend_from_slice(&(s.last.saturating_sub(s.pos) as u32).to_be_bytes());
        for &v in s.e.get(s.pos..s.last).unwrap_or(&[]) {
            if t.co64 {
                out.extend_from_slice(&v.wrapping_add(adjustment).to_be_bytes());
            } else {
                out.extend_from_slice(&(v as u32).wrapping_add(adjustment as u32).to_be_bytes());
            }
        }
    }
}

fn update_stts(mp4: &Mp4<'_>, t: &mut Trak) -> R<()> {
    if t.stts.is_none() {
        return Err(mp4.fail(format!("no mp4 stts atoms were found in \"{}\"", mp4.name)));
    }
    crop_stts(mp4, t, true)?;
    crop_stts(mp4, t, false)
}

fn crop_stts(mp4: &Mp4<'_>, t: &mut Trak, start: bool) -> R<()> {
    let ms = if start {
        mp4.p.start
    } else if mp4.p.length > 0 {
        mp4.p.length
    } else {
        return Ok(());
    };
    let key_frames = mp4.p.start_key_frame;
    let sync: Vec<u32> = match (&t.stss, key_frames && start) {
        (Some(s), true) => s.e.get(s.pos..s.last).unwrap_or(&[]).to_vec(),
        _ => Vec::new(),
    };
    let Some(stts) = t.stts.as_mut() else {
        return Ok(());
    };
    let mut start_time = Mp4::units(ms, t.timescale).saturating_add(t.prefix);
    let mut entries = t.time_to_sample_entries;
    let mut start_sample: u64 = 0;
    let mut idx = stts.pos;
    let mut found = None;
    while idx < stts.last {
        let Some(&(count, duration)) = stts.e.get(idx) else {
            break;
        };
        let span = u64::from(count) * u64::from(duration);
        if start_time < span {
            // duration > 0 here: span > start_time >= 0.
            let rest = start_time / u64::from(duration);
            start_sample += rest;
            found = Some((count, duration, rest));
            break;
        }
        start_sample += u64::from(count);
        start_time -= span;
        entries = entries.saturating_sub(1);
        idx += 1;
    }
    let Some((mut count, mut duration, mut rest)) = found else {
        if start {
            return Err(mp4.fail(format!(
                "start time is out mp4 stts samples in \"{}\"",
                mp4.name
            )));
        }
        t.end_sample = t.start_sample + start_sample;
        return Ok(());
    };
    if start {
        let mut key_prefix: u64 = if key_frames && t.stss.is_some() {
            // Sync samples count from 1.
            let s = start_sample + 1;
            let mut kp = 0;
            for &sample in &sync {
                if u64::from(sample) > s {
                    break;
                }
                kp = s - u64::from(sample);
            }
            kp
        } else {
            0
        };
        key_prefix = key_prefix.min(start_sample);
        start_sample -= key_prefix;
        while rest < key_prefix {
            t.prefix = t.prefix.saturating_add(rest * u64::from(duration));
            key_prefix -= rest;
            if idx == 0 || idx <= stts.pos {
                break;
            }
            idx -= 1;
            entries += 1;
            let Some(&(c, d)) = stts.e.get(idx) else {
                break;
            };
            count = c;
            duration = d;
            rest = u64::from(count);
        }
        let key_prefix = key_prefix.min(rest);
        t.prefix = t.prefix.saturating_add(key_prefix * u64::from(duration));
        t.duration = t.duration.saturating_add(t.prefix);
        rest -= key_prefix;
        if let Some(e) = stts.e.get_mut(idx) {
            e.0 = count.wrapping_sub(rest as u32);
        }
        stts.pos = idx;
        t.time_to_sample_entries = entries;
        t.start_sample = start_sample;
    } else {
        if let Some(e) = stts.e.get_mut(idx) {
            e.0 = rest as u32;
        }
        stts.last = idx + 1;
        t.time_to_sample_entries = t
            .time_to_sample_entries
            .saturating_sub(entries.saturating_sub(1));
        t.end_sample = t.start_sample + start_sample;
    }
    Ok(())
}

fn update_stss(mp4: &Mp4<'_>, t: &mut Trak) {
    if t.stss.is_none() {
        return;
    }
    crop_stss(mp4, t, true);
    crop_stss(mp4, t, false);
}

fn crop_stss(mp4: &Mp4<'_>, t: &mut Trak, start: bool) {
    let start_sample = if start {
        t.start_sample + 1
    } else if mp4.p.length > 0 {
        t.end_sample + 1
    } else {
        return;
    };
    let Some(s) = t.stss.as_mut() else {
        return;
    };
    let mut entries = t.sync_samples_entries;
    let mut idx = s.pos;
    while idx < s.last {
        if s.e.get(idx).is_some_and(|&v| u64::from(v) >= start_sample) {
            break;
        }
        entries = entries.saturating_sub(1);
        idx += 1;
    }
    if start {
        s.pos = idx;
        t.sync_samples_entries = entries;
    } else {
        s.last = idx;
        t.sync_samples_entries = t.sync_samples_entries.saturating_sub(entries);
    }
}

fn update_ctts(mp4: &Mp4<'_>, t: &mut Trak) {
    if t.ctts.is_none() {
        return;
    }
    crop_ctts(mp4, t, true);
    crop_ctts(mp4, t, false);
    if t.composition_offset_entries == 0 {
        t.ctts = None;
    }
}

fn crop_ctts(mp4: &Mp4<'_>, t: &mut Trak, start: bool) {
    let mut start_sample = if start {
        t.start_sample + 1
    } else if mp4.p.length > 0 {
        t.end_sample.wrapping_sub(t.start_sample).wrapping_add(1)
    } else {
        return;
    };
    let Some(c) = t.ctts.as_mut() else {
        return;
    };
    let mut entries = t.composition_offset_entries;
    let mut idx = c.pos;
    while idx < c.last {
        let Some(&(count, _)) = c.e.get(idx) else {
            break;
        };
        if start_sample <= u64::from(count) {
            let rest = start_sample.saturating_sub(1);
            if start {
                c.e[idx].0 = count - rest as u32;
                c.pos = idx;
                t.composition_offset_entries = entries;
            } else {
                c.e[idx].0 = rest as u32;
                c.last = idx + 1;
                t.composition_offset_entries = t
                    .composition_offset_entries
                    .saturating_sub(entries.saturating_sub(1));
            }
            return;
        }
        start_sample -= u64::from(count);
        entries = entries.saturating_sub(1);
        idx += 1;
    }
    if start {
        c.pos = c.last;
        t.composition_offset_entries = 0;
    }
}

fn update_stsc(mp4: &Mp4<'_>, t: &mut Trak) -> R<()> {
    if t.stsc.is_none() {
        return Err(mp4.fail(format!("no mp4 stsc atoms were found in \"{}\"", mp4.name)));
    }
    if t.sample_to_chunk_entries == 0 {
        return Err(mp4.fail(format!(
            "zero number of entries in stsc atom in \"{}\"",
            mp4.name
        )));
    }
    crop_stsc(mp4, t, true)?;
    crop_stsc(mp4, t, false)
}

fn crop_stsc(mp4: &Mp4<'_>, t: &mut Trak, start: bool) -> R<()> {
    let mut entries = t.sample_to_chunk_entries.saturating_sub(1);
    let mut start_sample: u32;
    if start {
        start_sample = t.start_sample as u32;
    } else if mp4.p.length > 0 {
        start_sample = t.end_sample.wrapping_sub(t.start_sample) as u32;
        if let Some(first) = t.stsc_start.as_mut() {
            let mut samples = first.1;
            entries = entries.saturating_sub(1);
            if samples > start_sample {
                samples = start_sample;
                first.1 = samples;
            }
            start_sample -= samples;
        }
    } else {
        return Ok(());
    }
    let chunks = t.chunks;
    let Some(s) = t.stsc.as_mut() else {
        return Ok(());
    };
    let Some(&(mut chunk, mut samples, mut id)) = s.e.get(s.pos).filter(|_| s.pos < s.last) else {
        return Err(mp4.fail(format!(
            "zero number of entries in stsc atom in \"{}\"",
            mp4.name
        )));
    };
    let mut prev_samples = 0u32;
    let mut idx = s.pos + 1;
    let mut next_chunk: u32;
    let mut hit = false;
    while idx < s.last {
        let Some(&(nc, ns, ni)) = s.e.get(idx) else {
            break;
        };
        next_chunk = nc;
        let n = next_chunk.wrapping_sub(chunk).wrapping_mul(samples);
        if start_sample < n {
            hit = true;
            break;
        }
        start_sample -= n;
        prev_samples = samples;
        chunk = next_chunk;
        samples = ns;
        id = ni;
        entries = entries.saturating_sub(1);
        idx += 1;
    }
    next_chunk = if hit {
        s.e.get(idx).map_or(0, |e| e.0)
    } else {
        let nc = (chunks as u32).wrapping_add(1);
        let n = nc.wrapping_sub(chunk).wrapping_mul(samples);
        if start_sample > n {
            return Err(mp4.fail(format!(
                "{} time is out mp4 stsc chunks in \"{}\"",
                if start { "start" } else { "end" },
                mp4.name
            )));
        }
        nc
    };
    entries += 1;
    idx -= 1;
    if samples == 0 {
        return Err(mp4.fail(format!("zero number of samples in \"{}\"", mp4.name)));
    }
    let target_chunk = u64::from(chunk)
        .wrapping_sub(1)
        .wrapping_add(u64::from(start_sample / samples));
    let chunk_samples = start_sample % samples;
    if start {
        s.pos = idx;
        t.sample_to_chunk_entries = entries;
        t.start_chunk = target_chunk;
        t.start_chunk_samples = u64::from(chunk_samples);
        if let Some(e) = s.e.get_mut(idx) {
            e.0 = (t.start_chunk as u32).wrapping_add(1);
        }
        samples -= chunk_samples;
    } else {
        if start_sample != 0 {
            s.last = idx + 1;
            t.sample_to_chunk_entries = t
                .sample_to_chunk_entries
                .saturating_sub(entries.saturating_sub(1));
            t.end_chunk_samples = u64::from(samples);
        } else {
            s.last = idx;
            t.sample_to_chunk_entries = t.sample_to_chunk_entries.saturating_sub(entries);
            t.end_chunk_samples = u64::from(prev_samples);
        }
        if chunk_samples != 0 {
            t.end_chunk = target_chunk.wrapping_add(1);
            t.end_chunk_samples = u64::from(chunk_samples);
        } else {
            t.end_chunk = target_chunk;
        }
        samples = chunk_samples;
        next_chunk = chunk.wrapping_add(1);
    }
    if chunk_samples != 0 && u64::from(next_chunk).wrapping_sub(target_chunk) == 2 {
        if let Some(e) = s.e.get_mut(idx) {
            e.1 = samples;
        }
    } else if chunk_samples != 0 && start {
        t.stsc_start = Some((1, samples, id));
        if let Some(e) = s.e.get_mut(idx) {
            e.0 = (t.start_chunk as u32).wrapping_add(2);
        }
        t.sample_to_chunk_entries += 1;
    } else if chunk_samples != 0 {
        t.stsc_end = Some((t.end_chunk.wrapping_sub(t.start_chunk) as u32, samples, id));
        t.sample_to_chunk_entries += 1;
    }
    Ok(())
}

fn update_stsz(mp4: &Mp4<'_>, t: &mut Trak) -> R<()> {
    let Some(s) = t.stsz.as_mut() else {
        return Ok(());
    };
    let mut entries = t.sample_sizes_entries;
    if t.start_sample > entries {
        return Err(mp4.fail(format!(
            "start time is out mp4 stsz samples in \"{}\"",
            mp4.name
        )));
    }
    entries -= t.start_sample;
    let pos = s.pos + t.start_sample as usize;
    let Some(before) = pos
        .checked_sub(t.start_chunk_samples as usize)
        .and_then(|from| s.e.get(from..pos))
    else {
        return Err(mp4.fail(format!(
            "too large mp4 start samples size in \"{}\"",
            mp4.name
        )));
    };
    t.start_chunk_samples_size = before.iter().map(|&v| u64::from(v)).sum();
    if t.start_chunk_samples_size > mp4.end {
        return Err(mp4.fail(format!(
            "too large mp4 start samples size in \"{}\"",
            mp4.name
        )));
    }
    s.pos = pos;
    if mp4.p.length > 0 {
        let want = t.end_sample.wrapping_sub(t.start_sample);
        if want > entries {
            return Err(mp4.fail(format!(
                "end time is out mp4 stsz samples in \"{}\"",
                mp4.name
            )));
        }
        let last = s.pos + want as usize;
        let Some(tail) = last
            .checked_sub(t.end_chunk_samples as usize)
            .and_then(|from| s.e.get(from..last))
        else {
            return Err(mp4.fail(format!(
                "too large mp4 end samples size in \"{}\"",
                mp4.name
            )));
        };
        t.end_chunk_samples_size = tail.iter().map(|&v| u64::from(v)).sum();
        if t.end_chunk_samples_size > mp4.end {
            return Err(mp4.fail(format!(
                "too large mp4 end samples size in \"{}\"",
                mp4.name
            )));
        }
        s.last = last;
    }
    if s.last < s.pos || s.last > s.e.len() {
        return Err(mp4.fail(format!(
            "start time is out mp4 stsz samples in \"{}\"",
            mp4.name
        )));
    }
    Ok(())
}

fn update_stco(mp4: &Mp4<'_>, t: &mut Trak) -> R<()> {
    let what = if t.co64 { "co64" } else { "stco" };
    let Some(s) = t.stco.as_mut() else {
        return Err(mp4.fail(format!("no mp4 stco atoms were found in \"{}\"", mp4.name)));
    };
    if t.start_chunk > t.chunks {
        return Err(mp4.fail(format!(
            "start time is out mp4 {} chunks in \"{}\"",
            what, mp4.name
        )));
    }
    let too_large = || mp4.fail(format!("too large chunk offset in \"{}\"", mp4.name));
    let pos = s.pos + t.start_chunk as usize;
    let check = |offset: u64, samples: u64| -> R<u64> {
        if offset > mp4.end.saturating_sub(samples)
            || (!t.co64 && offset + samples > u64::from(u32::MAX))
        {
            return Err(too_large());
        }
        Ok(offset + samples)
    };
    if let Some(&off) = s.e.get(pos) {
        t.start_offset = check(off, t.start_chunk_samples_size)?;
        s.e[pos] = t.start_offset;
    }
    s.pos = pos;
    let entries;
    if mp4.p.length > 0 {
        if t.end_chunk > t.chunks {
            return Err(mp4.fail(format!(
                "end time is out mp4 {} chunks in \"{}\"",
                what, mp4.name
            )));
        }
        entries = t.end_chunk.wrapping_sub(t.start_chunk);
        let last = s.pos.saturating_add(entries as usize);
        if last > s.e.len() {
            return Err(too_large());
        }
        s.last = last;
        if entries > 0 {
            let off = s.e[last - 1];
            t.end_offset = check(off, t.end_chunk_samples_size)?;
        }
    } else {
        entries = t.chunks - t.start_chunk;
        t.end_offset = mp4.mdat_last;
    }
    if entries == 0 || s.pos >= s.e.len() {
        t.start_offset = mp4.end;
        t.end_offset = 0;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(start: u64, length: u64) -> Params {
        Params {
            start,
            length,
            buffer_size: 512 * 1024,
            max_buffer_size: 10 * 1024 * 1024,
            start_key_frame: false,
        }
    }

    fn atom(name: &[u8; 4], data: &[u8]) -> Vec<u8> {
        atom_bytes(name, data)
    }

    fn full(name: &[u8; 4], vf: u32, body: &[u8]) -> Vec<u8> {
        let mut d = vf.to_be_bytes().to_vec();
        d.extend_from_slice(body);
        atom(name, &d)
    }

    fn words(v: &[u32]) -> Vec<u8> {
        v.iter().flat_map(|w| w.to_be_bytes()).collect()
    }

    /// A small file: one track of 10 samples of 100 bytes, 1 s each
    /// (timescale 1000), 2 samples per chunk, key frames 1 and 6.
    fn sample_file() -> Vec<u8> {
        let ftyp = atom(b"ftyp", b"isom\0\0\x02\0isomiso2");
        let mut mvhd = vec![0u8; 100];
        mvhd[12..16].copy_from_slice(&1000u32.to_be_bytes());
        mvhd[16..20].copy_from_slice(&10000u32.to_be_bytes());
        let mvhd = atom(b"mvhd", &mvhd);
        let mut tkhd = vec![0u8; 84];
        tkhd[20..24].copy_from_slice(&10000u32.to_be_bytes());
        let tkhd = atom(b"tkhd", &tkhd);
        let mut mdhd = vec![0u8; 24];
        mdhd[12..16].copy_from_slice(&1000u32.to_be_bytes());
        mdhd[16..20].copy_from_slice(&10000u32.to_be_bytes());
        let mdhd = atom(b"mdhd", &mdhd);
        let hdlr = atom(b"hdlr", &[0u8; 25]);
        let vmhd = atom(b"vmhd", &[0u8; 12]);
        let dinf = atom(b"dinf", &[0u8; 28]);
        let stsd = full(
            b"stsd",
            0,
            &words(&[1, 16, u32::from_be_bytes(*b"avc1"), 0]),
        );
        let stts = full(b"stts", 0, &words(&[1, 10, 1000]));
        let stss = full(b"stss", 0, &words(&[2, 1, 6]));
        let stsc = full(b"stsc", 0, &words(&[1, 1, 2, 1]));
        let stsz = full(
            b"stsz",
            0,
            &words(&[0, 10, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100]),
        );
        // The data comes after ftyp and a 8-byte mdat header; moov at the end.
        let data_at = (ftyp.len() + 8) as u32;
        let offsets: Vec<u32> = (0..5).map(|i| data_at + i * 200).collect();
        let mut stco_body = vec![5u32];
        stco_body.extend_from_slice(&offsets);
        let stco = full(b"stco", 0, &words(&stco_body));
        let stbl = atom(b"stbl", &[stsd, stts, stss, stsc, stsz, stco].concat());
        let minf = atom(b"minf", &[vmhd, dinf, stbl].concat());
        let mdia = atom(b"mdia", &[mdhd, hdlr, minf].concat());
        let trak = atom(b"trak", &[tkhd, mdia].concat());
        let moov = atom(b"moov", &[mvhd, trak].concat());
        let data: Vec<u8> = (0..1000u32).map(|i| (i / 100) as u8).collect();
        let mdat = atom(b"mdat", &data);
        [ftyp, mdat, moov].concat()
    }

    #[test]
    fn cuts_at_the_sample_of_the_start_time() {
        let f = sample_file();
        let Ok(Outcome::Cut(c)) = process(&Slice(&f), f.len() as u64, &params(3000, 0), "t.mp4")
        else {
            panic!("no cut");
        };
        // From sample 3 (0-based), the second half of chunk 1: 7 samples.
        assert_eq!(c.data_len, 700);
        let start = 24 + 8 + 300;
        assert_eq!(c.data_start, start as u64);
        let mut whole = c.header.clone();
        whole.extend_from_slice(&f[start..start + 700]);
        // The new file parses, and its table points at the new data.
        let Ok(Outcome::Cut(again)) =
            process(&Slice(&whole), whole.len() as u64, &params(0, 2000), "t")
        else {
            panic!("the cut file does not parse");
        };
        assert_eq!(again.data_len, 200);
        assert_eq!(whole[again.data_start as usize], 3);
    }

    #[test]
    fn start_past_the_end_and_moov_first() {
        let f = sample_file();
        assert!(process(&Slice(&f), f.len() as u64, &params(11000, 0), "t").is_err());
        // An end only: from 0 to 4.5 s.
        let Ok(Outcome::Cut(c)) = process(&Slice(&f), f.len() as u64, &params(0, 4500), "t") else {
            panic!("no cut");
        };
        // Samples 0..4 (the fifth starts at 4 s, within the range, but
        // nginx's cut ends at the sample the end time falls in).
        assert_eq!(c.data_len, 400);
    }

    /// Every truncation and many single-byte changes of a valid file end
    /// in an answer or a logged failure, never a panic.
    #[test]
    fn truncated_and_garbled_files_never_panic() {
        let f = sample_file();
        let ps = [
            params(0, 0),
            params(3000, 0),
            params(2500, 4000),
            params(0, 1),
        ];
        for cut in 0..f.len() {
            for p in &ps {
                let _ = process(&Slice(&f[..cut]), cut as u64, p, "t");
            }
        }
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let mut g = f.clone();
            for k in 0..1 + (seed % 4) as usize {
                let at = ((seed >> (8 * k)) as usize) % g.len();
                g[at] = (seed >> (16 + k)) as u8;
            }
            let p = &ps[(seed % ps.len() as u64) as usize];
            let _ = process(&Slice(&g), g.len() as u64, p, "t");
        }
    }

    #[test]
    fn start_values_as_nginx() {
        assert_eq!(atofp(b"2"), Some(2000));
        assert_eq!(atofp(b"7.1"), Some(7100));
        assert_eq!(atofp(b"2.7123456"), Some(2712));
        assert_eq!(atofp(b"."), Some(0));
        assert_eq!(atofp(b""), None);
        assert_eq!(atofp(b"1.2.3"), None);
        assert_eq!(atofp(b"-1"), None);
    }
}

//! The FastCGI wire format: records out (BEGIN_REQUEST, PARAMS, STDIN,
//! each padded to a multiple of 8 bytes, as nginx pads them), records in
//! ([`Decoder`]), and the CGI header block of STDOUT read as nginx reads
//! it ([`FcgiHead`], the engine's head reader; [`FcgiBody`] its body
//! decoder).

use std::sync::Arc;

use super::FastcgiLoc;
use crate::http::modules::cgi::{self, head_end, parse_head, status_of, Param};
use crate::http::phases::Ctx;
use crate::http::upstream::fetch::{fail, invalid_header, Fail, WHILE_HEAD};
use crate::http::upstream::response::header;
use crate::http::upstream::{BodyDecoder, Caching, Head, HeadReader};

const VERSION: u8 = 1;
const BEGIN_REQUEST: u8 = 1;
const END_REQUEST: u8 = 3;
const PARAMS: u8 = 4;
const STDIN: u8 = 5;
const STDOUT: u8 = 6;
const STDERR: u8 = 7;
const RESPONDER: u8 = 1;
const KEEP_CONN: u8 = 1;
/// nginx's largest STDIN record content.
const STDIN_MAX: usize = 32 * 1024;

/// Appends one record (request id 1) with its padding.
fn record(out: &mut Vec<u8>, kind: u8, content: &[u8]) {
    let len = content.len();
    let pad = (8 - len % 8) % 8;
    out.extend_from_slice(&[
        VERSION,
        kind,
        0,
        1,
        (len >> 8) as u8,
        len as u8,
        pad as u8,
        0,
    ]);
    out.extend_from_slice(content);
    out.extend_from_slice(&[0u8; 8][..pad]);
}

/// The body as STDIN records; an empty `data` is the closing record.
pub(super) fn stdin(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 16);
    if data.is_empty() {
        record(&mut out, STDIN, &[]);
    }
    for piece in data.chunks(STDIN_MAX) {
        record(&mut out, STDIN, piece);
    }
    out
}

/// A name-value pair's length: one byte below 128, else four with the
/// top bit set.
fn nv_len(out: &mut Vec<u8>, n: usize) {
    if n < 128 {
        out.push(n as u8);
    } else {
        out.extend_from_slice(&((n as u32) | 0x8000_0000).to_be_bytes());
    }
}

fn nv(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    nv_len(out, name.len());
    nv_len(out, value.len());
    out.extend_from_slice(name);
    out.extend_from_slice(value);
}

/// BEGIN_REQUEST, the params (one record, as nginx), the empty PARAMS
/// record. Err: nginx's message when they do not fit one record.
pub(super) fn request_head(
    cx: &Ctx<'_>,
    conf: &FastcgiLoc,
    keep_conn: bool,
    caching: Option<Caching<'_>>,
) -> Result<Vec<u8>, String> {
    let mut params = Vec::new();
    let list: &[Param] = conf.params.as_deref().map_or(&[], |v| v);
    let headers = conf.up.pass_request_headers.unwrap_or(true);
    cgi::params(cx, list, headers, caching, |n, v| nv(&mut params, n, v));
    if params.len() > 65535 {
        return Err(format!(
            "fastcgi request record is too big: {}",
            params.len()
        ));
    }
    let mut out = Vec::with_capacity(params.len() + 48);
    let flags = if keep_conn { KEEP_CONN } else { 0 };
    record(
        &mut out,
        BEGIN_REQUEST,
        &[0, RESPONDER, flags, 0, 0, 0, 0, 0],
    );
    if !params.is_empty() {
        record(&mut out, PARAMS, &params);
    }
    record(&mut out, PARAMS, &[]);
    Ok(out)
}

/// Where the decoder is in the record stream.
#[derive(Debug, Clone, Copy)]
enum Part {
    /// Collecting the 8-byte header (`have` of it so far).
    Header,
    /// Content of a record of `kind`, `left` bytes to go, then `pad`.
    Content {
        kind: u8,
        left: usize,
        pad: usize,
    },
    Padding {
        left: usize,
    },
}

/// The response's record stream, fed as it arrives: STDOUT content goes
/// to the caller, STDERR content is collected for the log, END_REQUEST
/// ends it.
#[derive(Debug)]
pub(crate) struct Decoder {
    part: Part,
    hdr: [u8; 8],
    have: usize,
    /// STDERR text since the last look (one entry per record).
    pub(super) stderr: Vec<Vec<u8>>,
    cur_err: Vec<u8>,
    /// END_REQUEST arrived.
    pub(crate) done: bool,
    /// Bytes came after END_REQUEST.
    pub(super) extra: bool,
    /// An empty STDOUT record arrived (the script's output ended).
    pub(super) stdout_closed: bool,
}

impl Decoder {
    pub(crate) fn new() -> Decoder {
        Decoder {
            part: Part::Header,
            hdr: [0; 8],
            have: 0,
            stderr: Vec::new(),
            cur_err: Vec::new(),
            done: false,
            extra: false,
            stdout_closed: false,
        }
    }

    /// Decodes `buf`, appending STDOUT content to `out`. Err: nginx's
    /// words for a broken stream.
    pub(crate) fn feed(&mut self, mut buf: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        while !buf.is_empty() {
            if self.done {
                self.extra = true;
                return Ok(());
            }
            match self.part {
                Part::Header => {
                    let take = (8 - self.have).min(buf.len());
                    self.hdr[self.have..self.have + take].copy_from_slice(&buf[..take]);
                    self.have += take;
                    buf = &buf[take..];
                    if self.have < 8 {
                        continue;
                    }
                    self.have = 0;
                    let h = self.hdr;
                    if h[0] != VERSION {
                        return Err(format!(
                            "upstream sent unsupported FastCGI protocol version: {}",
                            h[0]
                        ));
                    }
                    if !matches!(h[1], STDOUT | STDERR | END_REQUEST) {
                        return Err(format!(
                            "upstream sent invalid FastCGI record type: {}",
                            h[1]
                        ));
                    }
                    let left = usize::from(h[4]) << 8 | usize::from(h[5]);
                    let pad = usize::from(h[6]);
                    if h[1] == STDOUT && left == 0 {
                        self.stdout_closed = true;
                    }
                    self.part = Part::Content {
                        kind: h[1],
                        left,
                        pad,
                    };
                    self.after_content(false);
                }
                Part::Content { kind, left, pad } => {
                    let take = left.min(buf.len());
                    match kind {
                        STDOUT => out.extend_from_slice(&buf[..take]),
                        STDERR => self.cur_err.extend_from_slice(&buf[..take]),
                        // END_REQUEST's body (app status, protocol
                        // status) is not used, as nginx.
                        _ => {}
                    }
                    buf = &buf[take..];
                    self.part = Part::Content {
                        kind,
                        left: left - take,
                        pad,
                    };
                    self.after_content(false);
                }
                Part::Padding { left } => {
                    let take = left.min(buf.len());
                    buf = &buf[take..];
                    self.part = Part::Padding { left: left - take };
                    self.after_content(true);
                }
            }
        }
        Ok(())
    }

    /// Moves on once a record's content (and then its padding) is whole.
    fn after_content(&mut self, padding: bool) {
        match self.part {
            Part::Content { kind, left: 0, pad } if !padding => {
                if kind == STDERR && !self.cur_err.is_empty() {
                    self.stderr.push(std::mem::take(&mut self.cur_err));
                }
                if kind == END_REQUEST {
                    self.done = true;
                }
                self.part = Part::Padding { left: pad };
                self.after_content(true);
            }
            Part::Padding { left: 0 } => self.part = Part::Header,
            _ => {}
        }
    }
}

/// The error-log line for a STDERR record (nginx trims trailing line
/// ends and logs it at error level).
fn stderr_msg(e: &[u8], head: bool) -> String {
    let mut t = e;
    while let Some((&last, rest)) = t.split_last() {
        if last == b'\r' || last == b'\n' || last == b' ' || last == b'.' {
            t = rest;
        } else {
            break;
        }
    }
    format!(
        "FastCGI sent in stderr: \"{}\" while reading {}",
        String::from_utf8_lossy(t),
        if head {
            "response header from upstream"
        } else {
            "upstream"
        }
    )
}

/// Reads records until STDOUT holds the CGI header block: `Name: value`
/// lines ending with an empty line (CRLF or LF), at most `head_max`
/// bytes (fastcgi_buffer_size); STDERR goes to the log, or with
/// `fastcgi_catch_stderr` fails the attempt.
pub(super) struct FcgiHead {
    dec: Decoder,
    out: Vec<u8>,
    logs: Vec<String>,
    head_max: usize,
    head_only: bool,
    keep_conn: bool,
    catch: Arc<Vec<Vec<u8>>>,
}

impl FcgiHead {
    pub(super) fn new(
        head_only: bool,
        head_max: usize,
        keep_conn: bool,
        catch: Arc<Vec<Vec<u8>>>,
    ) -> FcgiHead {
        FcgiHead {
            dec: Decoder::new(),
            out: Vec::new(),
            logs: Vec::new(),
            head_max,
            head_only,
            keep_conn,
            catch,
        }
    }
}

impl HeadReader for FcgiHead {
    fn feed(&mut self, data: &[u8]) -> Result<Option<Head>, Fail> {
        if let Err(m) = self.dec.feed(data, &mut self.out) {
            return Err(invalid_header(&format!("{} {}", m, WHILE_HEAD)));
        }
        let caught = self
            .dec
            .stderr
            .iter()
            .any(|e| self.catch.iter().any(|c| contains(e, c)));
        for e in self.dec.stderr.drain(..) {
            self.logs.push(stderr_msg(&e, true));
        }
        if caught {
            // fastcgi_catch_stderr: an invalid response (nginx logs the
            // stderr line only).
            return Err(invalid_header(""));
        }
        if let Some((end, body_at)) = head_end(&self.out) {
            let (status, headers) = parse_head(&self.out[..end])
                .map_err(|m| invalid_header(&format!("{} {}", m, WHILE_HEAD)))?;
            // nginx's status line is the script's `Status:` as it came (or
            // its own for 302/200); a filter that changes the status
            // replaces it.
            let status_line = status_of(&headers)
                .map(|(_, l)| l.to_vec())
                .unwrap_or_default();
            let declared_len = header(&headers, "content-length")
                .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse().ok());
            let dec = std::mem::replace(&mut self.dec, Decoder::new());
            // nginx's `f->rest`: nothing after a 204 or 304; for HEAD the
            // length counts only once body bytes come.
            let rest = if status == 204 || status == 304 {
                Rest::Left(0)
            } else if self.head_only {
                Rest::Head
            } else {
                declared_len.map_or(Rest::Any, Rest::Left)
            };
            let mut decoder = FcgiBody {
                dec,
                rest,
                declared: declared_len,
                cut: false,
                short: false,
                reported: false,
            };
            let mut body = self.out[body_at..].to_vec();
            decoder.limit(&mut body, 0);
            return Ok(Some(Head {
                status,
                status_line,
                // No body for the client; the connection is not reused
                // (the rest of the records are not read).
                no_body: self.head_only || status == 204 || status == 304,
                declared_len,
                keep: self.keep_conn,
                headers,
                early: Vec::new(),
                body,
                decoder: Box::new(decoder),
            }));
        }
        if self.out.len() > self.head_max {
            return Err(invalid_header(&format!(
                "upstream sent too big header {}",
                WHILE_HEAD
            )));
        }
        if self.dec.done || self.dec.stdout_closed {
            // nginx's invalid header (fastcgi_next_upstream invalid_header
            // moves on).
            return Err(invalid_header(&format!(
                "upstream prematurely closed FastCGI stdout {}",
                WHILE_HEAD
            )));
        }
        Ok(None)
    }

    fn logs(&mut self) -> Vec<String> {
        std::mem::take(&mut self.logs)
    }
}

/// How much body `Content-Length` still allows (nginx's `f->rest`).
#[derive(Debug, Clone, Copy)]
enum Rest {
    /// No length declared: STDOUT until END_REQUEST.
    Any,
    /// An answer to HEAD: the declared length counts once body bytes come
    /// (a script that sends none is not short).
    Head,
    Left(u64),
}

/// The rest of the records after the head: STDOUT is the body, up to
/// `Content-Length` (more is dropped with nginx's warning, and ends the
/// body); END_REQUEST ends it, and before the declared length breaks it.
struct FcgiBody {
    dec: Decoder,
    rest: Rest,
    declared: Option<u64>,
    /// More than `Content-Length` arrived: the body ended there.
    cut: bool,
    /// The script's output ended short of `Content-Length`.
    short: bool,
    /// `short` was told to the engine.
    reported: bool,
}

impl FcgiBody {
    /// Applies the declared length to `out[from..]`, the STDOUT content
    /// just decoded, and notes a body that ended short.
    fn limit(&mut self, out: &mut Vec<u8>, from: usize) {
        let got = out.len().saturating_sub(from) as u64;
        if got > 0 {
            if let Rest::Head = self.rest {
                self.rest = self.declared.map_or(Rest::Any, Rest::Left);
            }
        }
        if let Rest::Left(left) = self.rest {
            if got > left {
                out.truncate(from + left as usize);
                self.cut = true;
                self.rest = Rest::Left(0);
            } else {
                self.rest = Rest::Left(left - got);
            }
        }
        let ended = self.dec.done || self.dec.stdout_closed;
        if ended && !self.cut && matches!(self.rest, Rest::Left(n) if n > 0) {
            self.short = true;
        }
    }
}

impl BodyDecoder for FcgiBody {
    fn feed(&mut self, buf: &[u8], out: &mut Vec<u8>) -> Result<(), Fail> {
        if self.cut {
            // What follows the declared length is dropped.
            self.dec.extra |= !buf.is_empty();
            return Ok(());
        }
        let from = out.len();
        self.dec
            .feed(buf, out)
            .map_err(|m| fail(502, format!("{} while reading upstream", m), false))?;
        self.limit(out, from);
        Ok(())
    }

    fn done(&self) -> bool {
        self.cut || (self.dec.done && !self.short)
    }

    fn extra(&self) -> bool {
        self.dec.extra || self.cut
    }

    fn extra_warning(&self) -> Option<&'static str> {
        self.cut
            .then_some("upstream sent more data than specified in \"Content-Length\" header")
    }

    fn broken(&mut self) -> Option<Fail> {
        if !self.short || self.reported {
            return None;
        }
        self.reported = true;
        // The empty STDOUT record ends the output first (nginx's buffered
        // reading names it); a bare END_REQUEST ends the request.
        let what = if self.dec.stdout_closed {
            "stdout"
        } else {
            "request"
        };
        Some(fail(
            502,
            format!(
                "upstream prematurely closed FastCGI {} while reading upstream",
                what
            ),
            false,
        ))
    }

    fn logs(&mut self) -> Vec<String> {
        self.dec
            .stderr
            .drain(..)
            .map(|e| stderr_msg(&e, false))
            .collect()
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || hay.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_padded_and_split() {
        let r = stdin(b"abc");
        assert_eq!(r, b"\x01\x05\x00\x01\x00\x03\x05\x00abc\0\0\0\0\0");
        assert_eq!(stdin(&[]), b"\x01\x05\x00\x01\x00\x00\x00\x00");
        let big = vec![b'x'; STDIN_MAX + 1];
        let r = stdin(&big);
        assert_eq!(r.len(), 8 + STDIN_MAX + 8 + 1 + 7);
    }

    #[test]
    fn name_value_lengths() {
        let mut o = Vec::new();
        nv(&mut o, b"A", &[b'v'; 200]);
        assert_eq!(&o[..5], &[1, 0x80, 0, 0, 200]);
        assert_eq!(o[5], b'A');
    }

    #[test]
    fn decoder_splits_streams_at_any_byte() {
        let mut s = Vec::new();
        record(&mut s, STDOUT, b"Status: 404\r\nX: y\r\n\r\nbody");
        record(&mut s, STDERR, b"oops\n");
        record(&mut s, STDOUT, b"-more");
        record(&mut s, END_REQUEST, &[0; 8]);
        for step in [1, 3, 7, 64] {
            let mut d = Decoder::new();
            let mut out = Vec::new();
            for c in s.chunks(step) {
                d.feed(c, &mut out).unwrap();
            }
            assert!(d.done && !d.extra);
            assert_eq!(out, b"Status: 404\r\nX: y\r\n\r\nbody-more");
            assert_eq!(d.stderr, vec![b"oops\n".to_vec()]);
        }
    }
}

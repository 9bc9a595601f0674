//! Strict, incremental decoder for `Transfer-Encoding: chunked` request
//! bodies.
//!
//! The grammar accepted is nginx's (`ngx_http_parse_chunked`), because a
//! front end and a back end that disagree on where a chunked body ends is
//! exactly what request smuggling exploits:
//!
//! * the size is hex (either case), starting immediately: no leading
//!   whitespace, no sign, no `0x`;
//! * after the size may come `;`, space or tab, and from there everything up
//!   to CR is a chunk extension, ignored (nginx does not parse extensions
//!   either; it only refuses LF in them);
//! * every line ends in CRLF: a bare LF, or anything but CRLF after chunk
//!   data, is an error;
//! * sizes are limited the way nginx limits them: once the accumulated size
//!   exceeds `i64::MAX / 16` any further byte of the size line is an error,
//!   so no size that could overflow `off_t` arithmetic is ever accepted;
//! * after the last chunk (`0`), trailer fields are accepted and discarded;
//!   the section ends with an empty line.
//!
//! Two bounds nginx does not have, added because a peer can otherwise make
//! us spin on framing bytes that carry no body: a size line (size plus
//! extensions) may be at most [`MAX_SIZE_LINE`] bytes, and the trailer
//! section at most [`MAX_TRAILERS`] bytes.
//!
//! The decoder keeps its position in a small state machine, so input may be
//! split at any byte. It never consumes past the end of the body, so bytes
//! of a pipelined next request stay with the caller.

/// The chunked framing is malformed; the caller answers 400 and closes.
#[derive(Debug, PartialEq, Eq)]
pub struct ChunkError;

/// Longest size line accepted: hex digits plus extensions, excluding CRLF.
pub const MAX_SIZE_LINE: usize = 4096;

/// Most bytes accepted in the trailer section, line terminators included.
pub const MAX_TRAILERS: usize = 8192;

/// nginx refuses a size once it exceeds `NGX_MAX_OFF_T_VALUE / 16` and
/// another byte of the size line follows.
const SIZE_LIMIT: u64 = (i64::MAX as u64) / 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// First hex digit of a chunk size.
    Start,
    /// Further hex digits, or the end of the size.
    Size,
    /// Inside extensions of a data chunk, until CR.
    Ext,
    /// Saw CR ending a data chunk's size line; need LF.
    ExtLf,
    /// Inside chunk data; `remaining` bytes left.
    Data,
    /// Need the CR that follows chunk data.
    DataCr,
    /// Need the LF that follows chunk data.
    DataLf,
    /// Inside extensions of the last (zero) chunk, until CR.
    LastExt,
    /// Saw CR ending the last chunk's size line; need LF.
    LastExtLf,
    /// Start of a trailer line (or of the final empty line).
    Trailer,
    /// Saw CR at the start of a trailer line; LF ends the body.
    TrailerEndLf,
    /// Inside a trailer field line, until CR.
    TrailerLine,
    /// Saw CR ending a trailer field line; need LF.
    TrailerLineLf,
    /// The body is complete.
    Done,
    /// A framing error was seen; the decoder stays failed.
    Failed,
}

/// Incremental chunked-body decoder. See the module docs for the grammar.
#[derive(Debug)]
pub struct ChunkedDecoder {
    state: State,
    /// Size being parsed, then bytes of the current chunk still to come.
    remaining: u64,
    /// Bytes of the current size line, for [`MAX_SIZE_LINE`].
    line_len: usize,
    /// Bytes of the trailer section so far, for [`MAX_TRAILERS`].
    trailer_len: usize,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        Self::new()
    }
}

fn hex_digit(b: u8) -> Option<u64> {
    match b {
        b'0'..=b'9' => Some(u64::from(b - b'0')),
        b'a'..=b'f' => Some(u64::from(b - b'a' + 10)),
        b'A'..=b'F' => Some(u64::from(b - b'A' + 10)),
        _ => None,
    }
}

impl ChunkedDecoder {
    pub fn new() -> Self {
        ChunkedDecoder {
            state: State::Start,
            remaining: 0,
            line_len: 0,
            trailer_len: 0,
        }
    }

    /// Whether the last chunk and the trailer section's final CRLF have been
    /// consumed.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Bytes of the current chunk still to come (0 outside chunk data):
    /// with what was decoded so far, the size the peer has announced, so
    /// a body limit can refuse a chunk as soon as its size line is read.
    pub fn chunk_remaining(&self) -> u64 {
        if self.state == State::Data {
            self.remaining
        } else {
            0
        }
    }

    /// Consume as much of `input` as possible, appending body bytes to
    /// `out`. Returns bytes consumed; this is less than `input.len()` only
    /// once the body is complete. Can be called with input split at any
    /// byte. After an error every later call fails too.
    pub fn decode(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, ChunkError> {
        let mut pos = 0;
        while pos < input.len() {
            match self.state {
                State::Done => return Ok(pos),
                State::Failed => return Err(ChunkError),
                State::Data => {
                    // Bulk copy: the only state that is not byte-at-a-time.
                    let avail = input.len() - pos;
                    let n = usize::try_from(self.remaining).map_or(avail, |r| r.min(avail));
                    out.extend_from_slice(&input[pos..pos + n]);
                    pos += n;
                    // n <= remaining by construction.
                    self.remaining -= n as u64;
                    if self.remaining == 0 {
                        self.state = State::DataCr;
                    }
                }
                _ => {
                    let b = input[pos];
                    pos += 1;
                    if let Err(e) = self.step(b) {
                        self.state = State::Failed;
                        return Err(e);
                    }
                }
            }
        }
        if self.state == State::Failed {
            return Err(ChunkError);
        }
        Ok(pos)
    }

    /// Advance the framing state machine by one byte (never in `Data`).
    fn step(&mut self, b: u8) -> Result<(), ChunkError> {
        match self.state {
            State::Start => {
                self.remaining = hex_digit(b).ok_or(ChunkError)?;
                self.line_len = 1;
                self.state = State::Size;
            }
            State::Size => {
                if self.remaining > SIZE_LIMIT {
                    return Err(ChunkError);
                }
                if b != b'\r' {
                    self.bump_line()?;
                }
                if let Some(d) = hex_digit(b) {
                    // Cannot overflow: remaining <= i64::MAX / 16.
                    self.remaining = self.remaining * 16 + d;
                    return Ok(());
                }
                let last = self.remaining == 0;
                self.state = match (b, last) {
                    (b'\r', false) => State::ExtLf,
                    (b'\r', true) => State::LastExtLf,
                    (b';' | b' ' | b'\t', false) => State::Ext,
                    (b';' | b' ' | b'\t', true) => State::LastExt,
                    _ => return Err(ChunkError),
                };
            }
            State::Ext | State::LastExt => match b {
                b'\r' => {
                    self.state = if self.state == State::Ext {
                        State::ExtLf
                    } else {
                        State::LastExtLf
                    };
                }
                b'\n' => return Err(ChunkError),
                _ => self.bump_line()?,
            },
            State::ExtLf => {
                if b != b'\n' {
                    return Err(ChunkError);
                }
                // A chunk size of 0 never gets here, so there is data.
                self.state = State::Data;
            }
            State::LastExtLf => {
                if b != b'\n' {
                    return Err(ChunkError);
                }
                self.state = State::Trailer;
            }
            State::DataCr => {
                if b != b'\r' {
                    return Err(ChunkError);
                }
                self.state = State::DataLf;
            }
            State::DataLf => {
                if b != b'\n' {
                    return Err(ChunkError);
                }
                self.state = State::Start;
            }
            State::Trailer => {
                self.bump_trailer()?;
                self.state = match b {
                    b'\r' => State::TrailerEndLf,
                    b'\n' => return Err(ChunkError),
                    _ => State::TrailerLine,
                };
            }
            State::TrailerEndLf => {
                self.bump_trailer()?;
                if b != b'\n' {
                    return Err(ChunkError);
                }
                self.state = State::Done;
            }
            State::TrailerLine => {
                self.bump_trailer()?;
                match b {
                    b'\r' => self.state = State::TrailerLineLf,
                    b'\n' => return Err(ChunkError),
                    _ => {}
                }
            }
            State::TrailerLineLf => {
                self.bump_trailer()?;
                if b != b'\n' {
                    return Err(ChunkError);
                }
                self.state = State::Trailer;
            }
            // Handled by the caller; reaching here would be a logic slip,
            // answered as a framing error rather than a panic.
            State::Data | State::Done | State::Failed => return Err(ChunkError),
        }
        Ok(())
    }

    fn bump_line(&mut self) -> Result<(), ChunkError> {
        self.line_len += 1;
        if self.line_len > MAX_SIZE_LINE {
            return Err(ChunkError);
        }
        Ok(())
    }

    fn bump_trailer(&mut self) -> Result<(), ChunkError> {
        self.trailer_len += 1;
        if self.trailer_len > MAX_TRAILERS {
            return Err(ChunkError);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decode in one call; returns (body, consumed, done).
    fn whole(input: &[u8]) -> Result<(Vec<u8>, usize, bool), ChunkError> {
        let mut d = ChunkedDecoder::new();
        let mut out = Vec::new();
        let n = d.decode(input, &mut out)?;
        Ok((out, n, d.is_done()))
    }

    /// Decode feeding the input in pieces cut at `cuts`.
    fn pieces(input: &[u8], cuts: &[usize]) -> Result<(Vec<u8>, usize, bool), ChunkError> {
        let mut d = ChunkedDecoder::new();
        let mut out = Vec::new();
        let mut consumed = 0;
        let mut start = 0;
        for &c in cuts.iter().chain(std::iter::once(&input.len())) {
            let n = d.decode(&input[start..c], &mut out)?;
            consumed += n;
            if n < c - start {
                // Decoder stopped: body done, rest belongs to the caller.
                assert!(d.is_done());
                return Ok((out, consumed, true));
            }
            start = c;
        }
        Ok((out, consumed, d.is_done()))
    }

    /// Every valid case must give the same result for every single split
    /// point and for byte-at-a-time feeding.
    fn check_splits(input: &[u8]) -> Result<(Vec<u8>, usize, bool), ChunkError> {
        let reference = whole(input);
        for cut in 0..=input.len() {
            assert_eq!(pieces(input, &[cut]), reference, "cut at {cut}");
        }
        let all: Vec<usize> = (1..input.len()).collect();
        assert_eq!(pieces(input, &all), reference, "byte at a time");
        reference
    }

    fn ok(input: &[u8], body: &[u8]) {
        let (out, n, done) = check_splits(input).unwrap();
        assert_eq!(out, body, "{:?}", String::from_utf8_lossy(input));
        assert_eq!(n, input.len());
        assert!(done);
    }

    fn bad(input: &[u8]) {
        assert_eq!(
            check_splits(input),
            Err(ChunkError),
            "{:?}",
            String::from_utf8_lossy(input)
        );
    }

    #[test]
    fn simple_bodies() {
        ok(b"0\r\n\r\n", b"");
        ok(b"5\r\nhello\r\n0\r\n\r\n", b"hello");
        ok(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", b"hello world");
        ok(b"a\r\n0123456789\r\n0\r\n\r\n", b"0123456789");
        ok(b"A\r\n0123456789\r\n0\r\n\r\n", b"0123456789");
        ok(b"000\r\n\r\n", b"");
        ok(b"0005\r\nhello\r\n0\r\n\r\n", b"hello");
        ok(b"1\r\n\r\r\n1\r\n\n\r\n0\r\n\r\n", b"\r\n");
    }

    #[test]
    fn extensions_and_whitespace() {
        ok(b"5;name\r\nhello\r\n0\r\n\r\n", b"hello");
        ok(b"5;name=value\r\nhello\r\n0;x=\"y\"\r\n\r\n", b"hello");
        ok(b"5 \r\nhello\r\n0\t\r\n\r\n", b"hello");
        ok(b"5 ;a=b\r\nhello\r\n0 ; c\r\n\r\n", b"hello");
        ok(b"5\t\t;a\r\nhello\r\n0\r\n\r\n", b"hello");
    }

    #[test]
    fn trailers() {
        ok(b"5\r\nhello\r\n0\r\nX-A: 1\r\n\r\n", b"hello");
        ok(b"0\r\nX-A: 1\r\nX-B: 2\r\n\r\n", b"");
    }

    #[test]
    fn stops_at_end_of_body() {
        let input = b"3\r\nabc\r\n0\r\n\r\nGET / HTTP/1.1\r\n";
        let (out, n, done) = check_splits(input).unwrap();
        assert_eq!(out, b"abc");
        assert_eq!(n, 13);
        assert!(done);
        // Further calls consume nothing.
        let mut d = ChunkedDecoder::new();
        let mut out = Vec::new();
        assert_eq!(d.decode(input, &mut out).unwrap(), 13);
        assert_eq!(d.decode(b"more", &mut out).unwrap(), 0);
        assert!(d.is_done());
    }

    #[test]
    fn incomplete_is_not_done() {
        for input in [
            &b""[..],
            b"5",
            b"5\r",
            b"5\r\nhel",
            b"5\r\nhello",
            b"5\r\nhello\r",
            b"5\r\nhello\r\n",
            b"5\r\nhello\r\n0",
            b"5\r\nhello\r\n0\r\n",
            b"5\r\nhello\r\n0\r\n\r",
            b"0\r\nX: y\r\n",
        ] {
            let (_, n, done) = check_splits(input).unwrap();
            assert_eq!(n, input.len());
            assert!(!done, "{:?}", String::from_utf8_lossy(input));
        }
    }

    #[test]
    fn bare_lf_rejected() {
        bad(b"5\nhello\r\n0\r\n\r\n");
        bad(b"5\r\nhello\n0\r\n\r\n");
        bad(b"5\r\nhello\r\n0\n\r\n");
        bad(b"5\r\nhello\r\n0\r\n\n");
        bad(b"5;ext\nhello\r\n0\r\n\r\n");
        bad(b"0;ext\n\r\n");
        bad(b"0\r\nX: y\n\r\n");
        bad(b"0\r\n\nX: y\r\n\r\n");
    }

    #[test]
    fn bad_framing() {
        bad(b"\r\n");
        bad(b" 5\r\nhello\r\n0\r\n\r\n");
        bad(b"\t5\r\nhello\r\n0\r\n\r\n");
        bad(b"g\r\n");
        bad(b"-5\r\n");
        bad(b"+5\r\n");
        bad(b"0x5\r\nhello\r\n0\r\n\r\n");
        bad(b"5x\r\nhello\r\n0\r\n\r\n");
        bad(b";\r\n");
        bad(b"5\rxhello\r\n0\r\n\r\n");
        bad(b"5\r\nhelloX\r\n0\r\n\r\n");
        bad(b"5\r\nhello\rX0\r\n\r\n");
        bad(b"5\r\nhello0\r\n\r\n");
        bad(b"3\r\nhello\r\n0\r\n\r\n");
        bad(b"0\r\n\rX");
        bad(b"0\r\nX: y\rZ\r\n");
    }

    #[test]
    fn size_overflow() {
        // Largest size nginx accepts: i64::MAX / 16.
        let max = format!("{:x}\r\n", (i64::MAX as u64) / 16);
        let (_, n, done) = check_splits(max.as_bytes()).unwrap();
        assert_eq!(n, max.len());
        assert!(!done);
        // One more hex digit of magnitude is refused at the next byte.
        bad(format!("{:x}\r\n", (i64::MAX as u64) / 16 + 1).as_bytes());
        bad(b"7fffffffffffffff\r\n");
        bad(b"ffffffffffffffff\r\n");
        bad(b"10000000000000000\r\n");
        bad(b"fffffffffffffffffffffffffffff\r\n");
        // Leading zeros do not count towards the value.
        ok(b"00000000000000000000000000001\r\nx\r\n0\r\n\r\n", b"x");
    }

    #[test]
    fn size_line_bound() {
        let mut line = b"1;".to_vec();
        line.resize(MAX_SIZE_LINE, b'x');
        line.extend_from_slice(b"\r\nA\r\n0\r\n\r\n");
        assert_eq!(whole(&line).unwrap().0, b"A");
        let mut line = b"1;".to_vec();
        line.resize(MAX_SIZE_LINE + 1, b'x');
        line.extend_from_slice(b"\r\nA\r\n0\r\n\r\n");
        assert_eq!(whole(&line), Err(ChunkError));
        let mut zeros = vec![b'0'; MAX_SIZE_LINE + 1];
        zeros.extend_from_slice(b"\r\n\r\n");
        assert_eq!(whole(&zeros), Err(ChunkError));
    }

    #[test]
    fn trailer_bound() {
        let mut body = b"0\r\n".to_vec();
        let field = b"X-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
        while body.len() + field.len() < MAX_TRAILERS {
            body.extend_from_slice(field);
        }
        let mut okb = body.clone();
        okb.extend_from_slice(b"\r\n");
        assert!(whole(&okb).unwrap().2);
        for _ in 0..200 {
            body.extend_from_slice(field);
        }
        body.extend_from_slice(b"\r\n");
        assert_eq!(whole(&body), Err(ChunkError));
    }

    #[test]
    fn error_is_sticky() {
        let mut d = ChunkedDecoder::new();
        let mut out = Vec::new();
        assert_eq!(d.decode(b"z", &mut out), Err(ChunkError));
        assert_eq!(d.decode(b"0\r\n\r\n", &mut out), Err(ChunkError));
        assert!(!d.is_done());
    }

    #[test]
    fn large_chunk_bulk() {
        let data = vec![7u8; 100_000];
        let mut input = format!("{:x}\r\n", data.len()).into_bytes();
        input.extend_from_slice(&data);
        input.extend_from_slice(b"\r\n0\r\n\r\n");
        let (out, n, done) = pieces(&input, &[3, 10, 5000, 99_000]).unwrap();
        assert_eq!(out, data);
        assert_eq!(n, input.len());
        assert!(done);
    }

    #[test]
    fn every_prefix_of_garbage_never_panics() {
        let alpha = [b'0', b'5', b'f', b'\r', b'\n', b';', b' ', b'x'];
        fn rec(buf: &mut Vec<u8>, alpha: &[u8], depth: usize) {
            let mut d = ChunkedDecoder::new();
            let mut out = Vec::new();
            let _ = d.decode(buf, &mut out);
            if depth == 0 {
                return;
            }
            for &c in alpha {
                buf.push(c);
                rec(buf, alpha, depth - 1);
                buf.pop();
            }
        }
        rec(&mut Vec::new(), &alpha, 6);
    }
}

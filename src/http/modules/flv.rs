//! nginx's flv module (`ngx_http_flv_module`): `flv` in a location makes
//! it the content handler for Flash video files with pseudo-streaming:
//! `?start=N` answers with the 13-byte FLV file header followed by the
//! file from byte N (the player asks for an offset it took from the
//! file's keyframe index), so the response is itself a valid FLV stream.
//!
//! ```text
//! GET/HEAD (else 405); a URI ending in `/` and a directory fall through
//!   to the static handler (nginx's handler declines)
//! open through the file-I/O layer (static_file's checks, disable_symlinks)
//! start = ?start= as digits; none, not a number or past the end: 0
//! 200: [FLV header (when start > 0)] + file[start..], Last-Modified and
//!   ETag of the file, its type; Range applies to that whole body
//! ```

use crate::config::registry::{ctx, Args, Setter, Spec};
use crate::config::{ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::conf::LocConf;
use crate::http::phases::{Ctx, Step};
use crate::http::response::{Body, Piece};

pub const DIRECTIVES: &[Spec] = &[Spec {
    name: "flv",
    ctx: ctx::LOC,
    args: Args::take(0),
    set: Setter::Loc(set_flv),
}];

/// The header nginx prepends: signature, version 1, audio and video,
/// header size 9, then the first PreviousTagSize (0).
const FLV_HEADER: &[u8; 13] = b"FLV\x01\x05\x00\x00\x00\x09\x00\x00\x00\x00";

#[derive(Debug, Clone, Default)]
pub struct FlvLoc {
    pub on: bool,
    /// `flv` is in this location itself: a content handler is not passed
    /// on to nested locations (nginx's clcf->handler), only to `if` and
    /// `limit_except` blocks.
    pub own: bool,
}

impl FlvLoc {
    pub fn merge(&mut self, p: &FlvLoc) {
        self.on |= p.on;
    }

    /// A nested location without its own `flv`.
    pub fn drop_inherited(&mut self) {
        if !self.own {
            self.on = false;
        }
    }
}

fn set_flv(l: &mut LocConf, _: &Directive, _: &mut Compiler) -> ConfResult<()> {
    l.modules.flv.on = true;
    l.modules.flv.own = true;
    Ok(())
}

/// nginx's ngx_atoof: decimal digits only, None on anything else or an
/// overflow.
pub(crate) fn atoof(v: &[u8]) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    let mut n: u64 = 0;
    for &c in v {
        if !c.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
    }
    // nginx's off_t is signed.
    (n <= i64::MAX as u64).then_some(n)
}

/// The content handler of a location with `flv`; None to fall through.
pub async fn content(cx: &mut Ctx<'_>) -> Option<Step> {
    if !cx.loc.modules.flv.on {
        return None;
    }
    let super::static_file::HandlerFile { path, file, policy } =
        match super::static_file::open_for_handler(cx).await? {
            Ok(f) => f,
            Err(step) => return Some(step),
        };
    let size = file.meta.size;
    let start = cx
        .args
        .as_deref()
        .and_then(|a| crate::http::uri::arg(a, b"start"))
        .and_then(atoof)
        .filter(|&s| s < size)
        .unwrap_or(0);
    let mut r = super::static_file::file_response(cx, &path, file.clone(), policy);
    if start > 0 {
        let len = size - start;
        r.content_length = Some(FLV_HEADER.len() as u64 + len);
        super::static_file::set_etag_len(
            cx,
            &mut r,
            file.meta.mtime,
            FLV_HEADER.len() as u64 + len,
        );
        r.body = Body::Multi(vec![
            Piece::Bytes(FLV_HEADER.to_vec()),
            Piece::File {
                file,
                offset: start,
                len,
            },
        ]);
    }
    r.headers.push(("Accept-Ranges".into(), b"bytes".to_vec()));
    Some(Step::Done(r))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_parsed_as_nginx() {
        assert_eq!(atoof(b"100"), Some(100));
        assert_eq!(atoof(b""), None);
        assert_eq!(atoof(b"-1"), None);
        assert_eq!(atoof(b"1x"), None);
        assert_eq!(atoof(b"99999999999999999999"), None);
    }
}

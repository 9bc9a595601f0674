//! `empty_gif`: the location answers with a 1x1 transparent GIF, as
//! nginx's empty_gif module does (the same 43 bytes, `image/gif`, and the
//! fixed Last-Modified that lets If-Modified-Since give 304).

use crate::config::registry::{ctx, Args, Setter, Spec};
use crate::config::ConfResult;
use crate::config::Directive;
use crate::core::conf::Compiler;
use crate::http::conf::LocConf;
use crate::http::phases::{Ctx, Step};
use crate::http::request::Method;
use crate::http::response::{Body, Response};

pub const DIRECTIVES: &[Spec] = &[Spec {
    name: "empty_gif",
    ctx: ctx::LOC,
    args: Args::take(0),
    set: Setter::Loc(set_empty_gif),
}];

#[derive(Debug, Clone, Default)]
pub struct EmptyGifLoc {
    /// Set only where the directive is: a content handler is not inherited
    /// by nested locations.
    pub on: bool,
}

fn set_empty_gif(l: &mut LocConf, _: &Directive, _: &mut Compiler) -> ConfResult<()> {
    l.modules.empty_gif.on = true;
    Ok(())
}

/// GIF89a, 1x1, a two-colour table whose second colour is transparent.
const GIF: [u8; 43] = [
    b'G', b'I', b'F', b'8', b'9', b'a', 0x01, 0x00, 0x01, 0x00, 0x80, 0x01, 0x00, 0x00, 0x00, 0x00,
    0xff, 0xff, 0xff, 0x21, 0xf9, 0x04, 0x01, 0x00, 0x00, 0x01, 0x00, 0x2c, 0x00, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x01, 0x00, 0x00, 0x02, 0x02, 0x4c, 0x01, 0x00, 0x3b,
];

/// The Last-Modified nginx gives it (Mon, 28 Sep 1970 06:00:00 GMT).
const LAST_MODIFIED: i64 = 23_349_600;

pub fn content(cx: &mut Ctx<'_>) -> Option<Step> {
    if !cx.loc.modules.empty_gif.on {
        return None;
    }
    if !matches!(cx.req.method, Method::Get | Method::Head) {
        return Some(Step::done(Response::status(405)));
    }
    let mut r = Response::status(200);
    r.content_type = Some("image/gif".into());
    r.content_length = Some(GIF.len() as u64);
    r.last_modified = Some(LAST_MODIFIED);
    r.body = Body::Bytes(GIF.to_vec());
    Some(Step::done(r))
}

//! `mirror` and `mirror_request_body`: shadow copies of a request sent
//! to other URIs, their responses ignored (nginx's
//! `ngx_http_mirror_module`).
//!
//! Data flow: in nginx's precontent phase (after try_files, before the
//! content handler; main requests only), [`precontent`] reads the client's
//! body first when `mirror_request_body` is on (the default; so the
//! main request's handler and every mirror see the same body), then starts
//! one background subrequest per `mirror` URI
//! ([`crate::http::subrequest::spawn_background`]) with the request's
//! args and method. The main request goes on at once; the mirrors run on
//! their own tasks and nobody reads their output.

use std::sync::Arc;

use crate::config::registry::{arg, ctx, duplicate, flag, set_once, Args, Setter, Spec};
use crate::config::{ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::body::TempDir;
use crate::http::conf::LocConf;
use crate::http::phases::{Ctx, Step};

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "mirror",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_mirror),
    },
    Spec {
        name: "mirror_request_body",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(set_request_body),
    },
];

#[derive(Debug, Clone, Default)]
pub struct MirrorLoc {
    /// The URIs of one level's `mirror` lines; `Some(None)`: `mirror off`.
    pub uris: Option<Option<Arc<Vec<Vec<u8>>>>>,
    pub request_body: Option<bool>,
    /// Where a body goes when it does not fit in memory and no
    /// `client_body_temp_path` is set (the prefix's `client_body_temp`).
    pub temp_default: Option<Arc<TempDir>>,
}

impl MirrorLoc {
    pub fn merge(&mut self, p: &MirrorLoc) {
        if self.uris.is_none() {
            self.uris = p.uris.clone();
            self.temp_default = p.temp_default.clone();
        }
        if self.request_body.is_none() {
            self.request_body = p.request_body;
        }
    }
}

fn set_mirror(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let m = &mut l.modules.mirror;
    let v = arg(d, 0);
    if v == "off" {
        if m.uris.is_some() {
            return Err(duplicate(d));
        }
        m.uris = Some(None);
        return Ok(());
    }
    let mut list = match m.uris.take() {
        Some(None) => return Err(duplicate(d)),
        Some(Some(l)) => (*l).clone(),
        None => Vec::new(),
    };
    list.push(v.as_bytes().to_vec());
    m.uris = Some(Some(Arc::new(list)));
    m.temp_default = Some(Arc::new(TempDir::plain(cx.path("client_body_temp"))));
    Ok(())
}

fn set_request_body(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    set_once(&mut l.modules.mirror.request_body, flag(d)?, d)
}

/// Starts the location's mirrors. `Some` ends the request (the body could
/// not be read).
pub async fn precontent(cx: &mut Ctx<'_>) -> Option<Step> {
    if cx.sub_depth > 0 || !matches!(cx.loc.modules.mirror.uris, Some(Some(_))) {
        return None;
    }
    let loc = cx.loc.clone();
    let conf = &loc.modules.mirror;
    let Some(Some(uris)) = &conf.uris else {
        return None;
    };
    let with_body = conf.request_body.unwrap_or(true);
    if with_body {
        let temp = conf
            .temp_default
            .clone()
            .unwrap_or_else(|| Arc::new(TempDir::plain("client_body_temp".into())));
        if let Err(r) = crate::http::body::read(cx, &temp).await {
            return Some(Step::Done(r));
        }
    }
    for uri in uris.iter() {
        crate::http::subrequest::spawn_background(
            cx,
            uri.clone(),
            cx.args.as_deref().map(<[u8]>::to_vec),
            cx.method,
            with_body,
        );
    }
    None
}

//! `add_before_body`, `add_after_body` and `addition_types`: a response's
//! body framed by the output of two subrequests (nginx's
//! `ngx_http_addition_filter_module`).
//!
//! Data flow: once the main request's response is decided (error pages
//! applied, before the header filters), [`apply`] looks at a 200 of a
//! main request whose type is in `addition_types` (default `text/html`):
//! Content-Length and Accept-Ranges go, a strong ETag turns weak (the
//! body is no longer the file's), and, unless the request is HEAD, the
//! subrequests run (URI as written, no args, GET) and the body becomes a
//! [`Chain`]: the before-subrequest's body, the response's own, the
//! after-subrequest's, streamed in that order (chunked for HTTP/1.1).
//! A subrequest that fails adds its error page, as in nginx.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;

use crate::config::registry::{arg, ctx, duplicate, Args, Setter, Spec};
use crate::config::{ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::conf::LocConf;
use crate::http::phases::Ctx;
use crate::http::request::Method;
use crate::http::response::{Body, BodyStream, Piece, Response, StreamFuture};
use crate::io::{OpenFile, Policy};

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "add_before_body",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_uri),
    },
    Spec {
        name: "add_after_body",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_uri),
    },
    Spec {
        name: "addition_types",
        ctx: ctx::HSL,
        args: Args::AtLeast(1),
        set: Setter::Loc(set_types),
    },
];

#[derive(Debug, Clone, Default)]
pub struct AdditionLoc {
    /// An empty value turns the addition off (nginx's empty string).
    pub before: Option<Arc<[u8]>>,
    pub after: Option<Arc<[u8]>>,
    /// `Some(None)`: `*`, any type; None: text/html.
    pub types: Option<Option<Arc<Vec<String>>>>,
}

impl AdditionLoc {
    pub fn merge(&mut self, p: &AdditionLoc) {
        if self.before.is_none() {
            self.before = p.before.clone();
        }
        if self.after.is_none() {
            self.after = p.after.clone();
        }
        if self.types.is_none() {
            self.types = p.types.clone();
        }
    }

    fn type_matches(&self, content_type: Option<&str>) -> bool {
        let t = content_type
            .and_then(|ct| ct.split(';').next())
            .unwrap_or("")
            .trim();
        match &self.types {
            Some(None) => true,
            Some(Some(list)) => list.iter().any(|x| x.eq_ignore_ascii_case(t)),
            None => t.eq_ignore_ascii_case("text/html"),
        }
    }
}

fn set_uri(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let a = &mut l.modules.addition;
    let slot = if d.name == "add_before_body" {
        &mut a.before
    } else {
        &mut a.after
    };
    if slot.is_some() {
        return Err(duplicate(d));
    }
    *slot = Some(Arc::from(arg(d, 0).as_bytes()));
    Ok(())
}

fn set_types(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let a = &mut l.modules.addition;
    if matches!(a.types, Some(None)) {
        return Ok(());
    }
    let mut list = match a.types.take() {
        Some(Some(v)) => (*v).clone(),
        _ => vec!["text/html".to_string()],
    };
    for x in &d.args {
        if x.value == "*" {
            a.types = Some(None);
            return Ok(());
        }
        list.push(x.value.to_ascii_lowercase());
    }
    a.types = Some(Some(Arc::new(list)));
    Ok(())
}

/// Frames the body of a main request's 200 with the subrequests' output.
pub async fn apply(cx: &mut Ctx<'_>, resp: &mut Response) {
    let conf = &cx.loc.modules.addition;
    // The common case returns here without touching anything shared.
    if (conf.before.is_none() && conf.after.is_none()) || resp.status != 200 || cx.sub_depth > 0 {
        return;
    }
    let before = conf.before.clone().filter(|u| !u.is_empty());
    let after = conf.after.clone().filter(|u| !u.is_empty());
    if before.is_none() && after.is_none() {
        return;
    }
    if !conf.type_matches(resp.content_type.as_deref()) {
        return;
    }
    resp.content_length = None;
    resp.remove_header("Accept-Ranges");
    resp.ranges_off = true;
    super::gzip::weaken_etag(resp);
    if cx.method == Method::Head || cx.req.method == Method::Head {
        return;
    }
    let mut parts = VecDeque::new();
    if let Some(u) = before {
        sub_output(cx, &u, &mut parts).await;
    }
    let policy = resp.io.take().unwrap_or_default();
    push_body(&mut parts, std::mem::take(&mut resp.body), Arc::new(policy));
    if let Some(u) = after {
        sub_output(cx, &u, &mut parts).await;
    }
    resp.body = Body::Stream(Box::new(Chain { parts }));
}

async fn sub_output(cx: &Ctx<'_>, uri: &[u8], parts: &mut VecDeque<Part>) {
    let Some(mut sub) = cx.subrequest(uri.to_vec(), None, Method::Get, true) else {
        return;
    };
    let mut r = crate::http::subrequest::run(&mut sub).await;
    crate::http::subrequest::finish(cx, sub);
    let policy = r.io.take().unwrap_or_default();
    push_body(parts, std::mem::take(&mut r.body), Arc::new(policy));
}

fn push_body(parts: &mut VecDeque<Part>, body: Body, policy: Arc<Policy>) {
    match body {
        Body::Empty => {}
        Body::Bytes(b) => parts.push_back(Part::Bytes(Bytes::from(b))),
        Body::Shared(b) => parts.push_back(Part::Bytes(b)),
        Body::File { file, offset, len } => parts.push_back(Part::File {
            file,
            offset,
            len,
            policy,
        }),
        Body::Multi(pieces) => {
            for p in pieces {
                match p {
                    Piece::Bytes(b) => parts.push_back(Part::Bytes(Bytes::from(b))),
                    Piece::File { file, offset, len } => parts.push_back(Part::File {
                        file,
                        offset,
                        len,
                        policy: policy.clone(),
                    }),
                }
            }
        }
        Body::Stream(s) => parts.push_back(Part::Stream(s)),
    }
}

/// A body as a stream (files read through the file-I/O layer in pieces):
/// how slice passes its slices' bodies on.
pub(crate) fn into_stream(body: Body, policy: Arc<Policy>) -> Box<dyn BodyStream> {
    let mut parts = VecDeque::new();
    push_body(&mut parts, body, policy);
    Box::new(Chain { parts })
}

/// One source of a [`Chain`].
enum Part {
    Bytes(Bytes),
    File {
        file: Arc<OpenFile>,
        offset: u64,
        len: u64,
        policy: Arc<Policy>,
    },
    Stream(Box<dyn BodyStream>),
}

/// Bodies one after another, as one streamed body.
struct Chain {
    parts: VecDeque<Part>,
}

/// How much of a file one piece of a chain reads.
const FILE_PIECE: u64 = 64 << 10;

impl BodyStream for Chain {
    fn next(&mut self) -> std::pin::Pin<Box<dyn StreamFuture<'_> + '_>> {
        Box::pin(async move {
            loop {
                let Some(p) = self.parts.front_mut() else {
                    return Ok(None);
                };
                match p {
                    Part::Bytes(b) => {
                        let b = std::mem::take(b);
                        self.parts.pop_front();
                        if !b.is_empty() {
                            return Ok(Some(b));
                        }
                    }
                    Part::File {
                        file,
                        offset,
                        len,
                        policy,
                    } => {
                        if *len == 0 {
                            self.parts.pop_front();
                            continue;
                        }
                        let n = (*len).min(FILE_PIECE) as usize;
                        let data = crate::io::read(file, *offset, n, policy).await?;
                        if data.is_empty() {
                            return Err(std::io::Error::new(
                                std::io::ErrorKind::UnexpectedEof,
                                "file was truncated while being sent",
                            ));
                        }
                        *offset += data.len() as u64;
                        *len -= (data.len() as u64).min(*len);
                        return Ok(Some(data));
                    }
                    Part::Stream(s) => match s.next().await? {
                        Some(b) => return Ok(Some(b)),
                        None => {
                            self.parts.pop_front();
                        }
                    },
                }
            }
        })
    }

    fn ready(&self) -> bool {
        match self.parts.front() {
            None | Some(Part::Bytes(_)) => true,
            Some(Part::Stream(s)) => s.ready(),
            Some(Part::File { .. }) => false,
        }
    }
}

//! nginx's random_index module: `random_index on` answers a URI ending in
//! `/` with an internal redirect to one of the directory's regular files
//! (not those whose name starts with `.`), picked at random. A directory
//! with no such file falls through to `index` and `autoindex`, as nginx's
//! handler declines. The directory is read in the location's thread pool
//! ([`super::autoindex::list`]), never on the worker's thread.

use crate::config::registry::{ctx, flag, set_once, Args, Setter, Spec};
use crate::config::{ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::conf::LocConf;
use crate::http::modules::autoindex::{self, Kind};
use crate::http::phases::{Ctx, Step};

pub const DIRECTIVES: &[Spec] = &[Spec {
    name: "random_index",
    ctx: ctx::LOC,
    args: Args::Flag,
    set: Setter::Loc(set_random_index),
}];

#[derive(Debug, Clone, Default)]
pub struct RandomIndexLoc {
    pub on: Option<bool>,
}

impl RandomIndexLoc {
    pub fn merge(&mut self, p: &RandomIndexLoc) {
        if self.on.is_none() {
            self.on = p.on;
        }
    }
}

fn set_random_index(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut l.modules.random_index.on, v, d)
}

/// For a directory URI: the redirect to a random file, an error
/// response, or None to go on with `index`.
pub async fn content(cx: &mut Ctx<'_>) -> Option<Step> {
    if !cx.loc.modules.random_index.on.unwrap_or(false) || !cx.uri.ends_with(b"/") {
        return None;
    }
    let dir = cx.request_filename();
    let entries = match autoindex::list(cx, &dir).await {
        Ok(e) => e,
        Err(r) => return Some(Step::done(r)),
    };
    let files: Vec<_> = entries.iter().filter(|e| e.kind == Kind::File).collect();
    if files.is_empty() {
        return None;
    }
    let pick = files[(random_u64() % files.len() as u64) as usize];
    // The name joins the (decoded) URI as it is, as in nginx.
    let mut uri = cx.uri.to_vec();
    uri.extend_from_slice(&pick.name);
    Some(Step::Redirect(uri))
}

/// A random number from the standard library's per-process hash keys
/// (`RandomState` differs on every call): good enough to spread picks.
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    h.finish()
}

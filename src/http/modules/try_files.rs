//! `try_files file ... uri | =code`: the try-files phase, run before the
//! content handlers. Each candidate is a template tested against the
//! file system through the file-I/O layer (`name/` tests a directory); the
//! first that exists becomes the URI served by this location; otherwise
//! the last argument decides: `=code`, `@named` location, or an internal
//! redirect to a URI.

use std::os::unix::ffi::OsStrExt;

use crate::config::registry::{ctx, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::conf::LocConf;
use crate::http::phases::{Ctx, Step};
use crate::http::response::Response;
use crate::http::vars::Template;

#[derive(Debug, Clone)]
pub enum Fallback {
    Code(u16),
    Named(String),
    Uri(Template),
}

#[derive(Debug, Clone)]
pub struct TryFiles {
    /// Candidates and whether each tests a directory (trailing `/`).
    pub files: Vec<(Template, bool)>,
    pub fallback: Fallback,
}

#[derive(Debug, Clone, Default)]
pub struct TryFilesLoc {
    /// Not inherited (nginx's try_files is per location).
    pub try_files: Option<TryFiles>,
}

impl TryFilesLoc {
    pub fn merge(&mut self, _p: &TryFilesLoc) {}
}

/// Runs try_files if the location has it. `Step::Next` means: serve
/// `cx.uri` (possibly changed) with the content handlers.
pub async fn run(cx: &mut Ctx<'_>) -> Step {
    let Some(tf) = cx.loc.modules.try_files.try_files.clone() else {
        return Step::Next;
    };
    let policy = match cx.io_policy() {
        Ok(p) => p,
        Err(r) => return Step::Done(r),
    };
    for (t, dir) in &tf.files {
        let name = t.render_vec(&*cx);
        let mut path = cx.root();
        if cx.alias {
            // The part of the name under the aliased location's own name
            // (nginx's clcf->alias); an alias set in a regex location
            // takes the whole name.
            let rest = match cx.loc.core.alias_len {
                Some(usize::MAX) => &name[..],
                n => {
                    let n = n.unwrap_or(cx.loc_prefix_len);
                    name.get(n.min(name.len())..).unwrap_or(b"")
                }
            };
            path.extend_from_slice(rest);
        } else {
            path.extend_from_slice(&name);
        }
        // A path refused by disable_symlinks is a miss, as in nginx.
        let m = match super::static_file::symlink_check(cx, &path, &policy).await {
            Ok(()) => {
                crate::io::stat(
                    std::path::Path::new(std::ffi::OsStr::from_bytes(&path)),
                    &policy,
                )
                .await
            }
            Err(e) => Err(e),
        };
        let hit = match m {
            Ok(m) => m.is_dir == *dir,
            Err(_) => false,
        };
        if hit {
            // A directory hit leaves the URI without its slash, so the static
            // handler answers with nginx's 301 to "dir/".
            cx.add_uri_to_alias = cx.alias && !*dir && cx.loc.core.alias_len == Some(usize::MAX);
            cx.uri = name.into();
            return Step::Next;
        }
    }
    match &tf.fallback {
        Fallback::Code(c) => Step::done(Response::status(*c)),
        Fallback::Named(n) => Step::Named(n.clone()),
        Fallback::Uri(t) => {
            let mut u = t.render_vec(&*cx);
            cx.take_args(&mut u);
            Step::Redirect(u)
        }
    }
}

fn set_try_files(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    if l.modules.try_files.try_files.is_some() {
        return Err(crate::config::registry::duplicate(d));
    }
    let n = d.args.len();
    let mut files = Vec::new();
    for a in &d.args[..n - 1] {
        let dir = a.value.ends_with('/') && a.value.len() > 1;
        let v = if dir {
            &a.value[..a.value.len() - 1]
        } else {
            a.value.as_str()
        };
        files.push((cx.template(v, d)?, dir));
    }
    let last = d.args[n - 1].value.as_str();
    let fallback = if let Some(c) = last.strip_prefix('=') {
        let code: u16 = c
            .parse()
            .ok()
            .filter(|c| (1..=999).contains(c))
            .ok_or_else(|| ConfError::at(format!("invalid code \"{}\"", last), d))?;
        Fallback::Code(code)
    } else if last.starts_with('@') {
        Fallback::Named(last.to_string())
    } else {
        Fallback::Uri(cx.template(last, d)?)
    };
    l.modules.try_files.try_files = Some(TryFiles { files, fallback });
    Ok(())
}

pub const DIRECTIVES: &[Spec] = &[Spec {
    name: "try_files",
    ctx: ctx::SRV | ctx::LOC,
    args: Args::AtLeast(2),
    set: Setter::Loc(set_try_files),
}];

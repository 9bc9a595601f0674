//! `PREFIX_cache_purge ZONE KEY` (proxy, fastcgi, scgi, uwsgi): a location
//! whose requests remove a cache entry, with the syntax and answers of
//! the widely used third-party ngx_cache_purge module (which nginx itself
//! only sells):
//!
//! ```text
//! location ~ /purge(/.*) { proxy_cache_purge zone $1; }
//!   KEY rendered ── md5 ── the zone's node removed, the file unlinked
//!     (with the key's Vary variants, which live under hashes of their own)
//!     ├─ there was an entry ──▶ 200 "Successful purge" page (Key, Path)
//!     └─ none ──▶ 404
//!   KEY ending in `*` (tern's addition: a key prefix) ── every entry of
//!     the zone whose file's key starts with the prefix, removed
//!     ├─ any ──▶ 200 page (Key: the pattern, Path: the cache directory)
//!     └─ none ──▶ 404
//! ```
//!
//! The node goes first, then the file: a lookup that starts after the
//! purge finds no node (a miss once the loader has seen the tree) or no
//! file, so the entry is never served again by any worker. A lookup that
//! had already opened the file finishes the answer it started.
//! The module's other form (`proxy_cache_purge on|METHOD [from ...]` in
//! the caching location itself) is refused as not supported yet.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use super::conf::Slot;
use crate::cache::{self as store, md5};
use crate::config::registry::arg;
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::http::conf::LocConf;
use crate::http::phases::Ctx;
use crate::http::response::{Body, Response};
use crate::http::vars::Template;
use crate::io::Policy;

/// A compiled `PREFIX_cache_purge ZONE KEY`.
#[derive(Debug)]
pub struct Purge {
    pub zone: String,
    pub key: Template,
}

pub fn set_purge<S: Slot>(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let same_location =
        d.args.len() != 2 || matches!(arg(d, 0), "on" | "off") || arg(d, 1) == "from";
    if same_location {
        return Err(ConfError::at(
            format!(
                "\"{}\" in the caching location (on|off|METHOD [from ...]) is not supported by tern yet; use \"{} ZONE KEY\" in a location of its own",
                d.name, d.name
            ),
            d,
        ));
    }
    if S::conf(l).purge.is_some() {
        return Err(crate::config::registry::duplicate(d));
    }
    let key = cx.template(arg(d, 1), d)?;
    S::conf(l).purge = Some(Arc::new(Purge {
        zone: arg(d, 0).to_string(),
        key,
    }));
    l.content = Some(content::<S>);
    Ok(())
}

/// The content handler of a purging location.
pub fn content<'a, S: Slot>(cx: &'a mut Ctx<'_>) -> Pin<Box<dyn Future<Output = Response> + 'a>> {
    let p = S::get(&cx.loc).purge.clone();
    Box::pin(handle(cx, p))
}

async fn handle(cx: &mut Ctx<'_>, p: Option<Arc<Purge>>) -> Response {
    let Some(p) = p else {
        return Response::status(500);
    };
    let Some(z) = cx.http.main.modules.upstream.zones.get(&p.zone).cloned() else {
        cx.log(Level::Error, &format!("cache \"{}\" not found", p.zone));
        return Response::status(500);
    };
    let policy = match cx.io_policy() {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let key = p.key.render_vec(&*cx);
    let path = match key.strip_suffix(b"*") {
        Some(prefix) => {
            if purge_prefix(cx, &z, prefix, &policy).await == 0 {
                return Response::status(404);
            }
            z.conf.path.clone()
        }
        None => {
            let md5 = md5::digest(&key);
            let path = z.file_path(&md5);
            let mut any = purge_one(cx, &z, &md5, &policy).await;
            // The key's Vary variants (files named by their variant hash)
            // go with it.
            for v in z.take_variants(&md5) {
                any |= purge_one(cx, &z, &v, &policy).await;
            }
            if !any {
                return Response::status(404);
            }
            path
        }
    };
    page(&key, &path)
}

/// Removes one entry: true when there was one (a node, or a file).
async fn purge_one(cx: &Ctx<'_>, z: &Arc<store::Zone>, md5: &[u8; 16], policy: &Policy) -> bool {
    let had_node = z.touch(md5).is_some();
    z.remove(md5);
    let path = z.file_path(md5);
    let p = path.clone();
    match store::blocking(policy, move || std::fs::remove_file(&p)).await {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => had_node,
        Err(e) => {
            // As the module: the log has it, the client is told it is gone.
            cx.log(
                Level::Crit,
                &format!(
                    "unlink() \"{}\" failed {}",
                    path.display(),
                    crate::core::errno_text(&e)
                ),
            );
            true
        }
    }
}

/// Removes every entry whose key starts with `prefix`; how many.
async fn purge_prefix(cx: &Ctx<'_>, z: &Arc<store::Zone>, prefix: &[u8], policy: &Policy) -> usize {
    let mut n = 0;
    for md5 in z.hashes() {
        let path = z.file_path(&md5);
        let want = prefix.to_vec();
        // Only the key is read: the header's fixed part and the key.
        let matches = store::blocking(policy, move || key_has_prefix(&path, &want)).await;
        if matches.unwrap_or(false) && purge_one(cx, z, &md5, policy).await {
            n += 1;
        }
    }
    n
}

/// The cache file's key starts with `prefix` (false for a file that is
/// gone or not a cache file).
fn key_has_prefix(path: &std::path::Path, prefix: &[u8]) -> std::io::Result<bool> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 4096];
    let mut have = 0;
    loop {
        match store::file::EntryHead::parse(&buf[..have]) {
            Ok(h) => return Ok(h.key.starts_with(prefix)),
            Err(store::file::ParseError::Need(n)) if n <= 1 << 20 => {
                if buf.len() < n {
                    buf.resize(n, 0);
                }
                let got = f.read(&mut buf[have..])?;
                if got == 0 {
                    return Ok(false);
                }
                have += got;
            }
            Err(_) => return Ok(false),
        }
    }
}

/// The module's page: `Successful purge`, the key and the file's path.
fn page(key: &[u8], path: &std::path::Path) -> Response {
    use std::os::unix::ffi::OsStrExt;
    let mut b = Vec::with_capacity(256 + key.len());
    b.extend_from_slice(
        b"<html>\r\n<head><title>Successful purge</title></head>\r\n<body bgcolor=\"white\">\r\n<center><h1>Successful purge</h1>\r\n",
    );
    b.extend_from_slice(b"<br>Key : ");
    b.extend_from_slice(key);
    b.extend_from_slice(b"\r\n<br>Path: ");
    b.extend_from_slice(PathBuf::from(path).as_os_str().as_bytes());
    b.extend_from_slice(b"\r\n</center>\r\n<hr><center>tern/");
    b.extend_from_slice(env!("CARGO_PKG_VERSION").as_bytes());
    b.extend_from_slice(b"</center>\r\n</body>\r\n</html>\r\n");
    let mut r = Response::status(200);
    r.content_type = Some("text/html".into());
    r.content_length = Some(b.len() as u64);
    r.body = Body::Bytes(b);
    r
}

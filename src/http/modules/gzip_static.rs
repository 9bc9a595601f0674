//! `gzip_static`, `gunzip`: serving precompressed `.gz` files.
//!
//! Placeholder: the directive table is empty until the module lands.

use crate::config::registry::Spec;

#[derive(Debug, Clone, Default)]
pub struct GzipStaticLoc {}

impl GzipStaticLoc {
    pub fn merge(&mut self, _p: &GzipStaticLoc) {}
}

pub const DIRECTIVES: &[Spec] = &[];

/// Called by the static handler for a regular file at `path`: returns a
/// response serving `path.gz` instead, when gzip_static applies.
pub async fn try_serve(
    _cx: &mut crate::http::phases::Ctx<'_>,
    _path: &[u8],
) -> Option<crate::http::response::Response> {
    None
}

//! `autoindex*`: directory listings (content, after index).
//!
//! Placeholder: the directive table is empty until the module lands.

use crate::config::registry::Spec;

#[derive(Debug, Clone, Default)]
pub struct AutoindexLoc {}

impl AutoindexLoc {
    pub fn merge(&mut self, _p: &AutoindexLoc) {}
}

pub const DIRECTIVES: &[Spec] = &[];

/// Called for a directory URI with no index file: a listing, or None
/// (then the directory is forbidden, 403).
pub async fn handle(
    _cx: &mut crate::http::phases::Ctx<'_>,
    _dir: &[u8],
) -> Option<crate::http::response::Response> {
    None
}

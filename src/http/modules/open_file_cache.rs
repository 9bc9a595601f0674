//! `open_file_cache*`: cached descriptors in front of the file-I/O layer.
//!
//! Placeholder: the directive table is empty until the module lands.

use crate::config::registry::Spec;

#[derive(Debug, Clone, Default)]
pub struct OpenFileCacheLoc {}

impl OpenFileCacheLoc {
    pub fn merge(&mut self, _p: &OpenFileCacheLoc) {}
}

pub const DIRECTIVES: &[Spec] = &[];

/// Opens `path` through the location's open file cache (or directly through
/// the file-I/O layer when the cache is off).
pub async fn open(
    _cx: &crate::http::phases::Ctx<'_>,
    path: &std::path::Path,
    policy: &crate::io::Policy,
) -> std::io::Result<std::sync::Arc<crate::io::OpenFile>> {
    crate::io::open(path, policy).await
}

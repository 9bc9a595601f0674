//! `gzip*`: the gzip header and body filter.
//!
//! Placeholder: the directive table is empty until the module lands.

use crate::config::registry::Spec;

#[derive(Debug, Clone, Default)]
pub struct GzipLoc {}

impl GzipLoc {
    pub fn merge(&mut self, _p: &GzipLoc) {}
}

pub const DIRECTIVES: &[Spec] = &[];

/// Header filter: decides whether to compress and installs the body filter.
pub fn header_filter(
    _cx: &mut crate::http::phases::Ctx<'_>,
    _resp: &mut crate::http::response::Response,
) {
}

/// Module variables (`$gzip_ratio`).
pub const VARS: &[&str] = &[];

pub fn var(_cx: &crate::http::phases::Ctx<'_>, _i: u8, _out: &mut Vec<u8>) -> bool {
    false
}

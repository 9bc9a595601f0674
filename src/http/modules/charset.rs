//! `charset`, `charset_types`, `source_charset`, `override_charset`: the charset filter.
//!
//! Placeholder: the directive table is empty until the module lands.

use crate::config::registry::Spec;

#[derive(Debug, Clone, Default)]
pub struct CharsetLoc {}

impl CharsetLoc {
    pub fn merge(&mut self, _p: &CharsetLoc) {}
}

pub const DIRECTIVES: &[Spec] = &[];

/// Header filter (see `phases::HEADER_FILTERS` for the order).
pub fn header_filter(
    _cx: &mut crate::http::phases::Ctx<'_>,
    _resp: &mut crate::http::response::Response,
) {
}

//! `if_modified_since` and conditional requests (304/412): the not_modified filter.
//!
//! Placeholder: the directive table is empty until the module lands.

use crate::config::registry::Spec;

#[derive(Debug, Clone, Default)]
pub struct NotModifiedLoc {}

impl NotModifiedLoc {
    pub fn merge(&mut self, _p: &NotModifiedLoc) {}
}

pub const DIRECTIVES: &[Spec] = &[];

/// Header filter (see `phases::HEADER_FILTERS` for the order).
pub fn header_filter(
    _cx: &mut crate::http::phases::Ctx<'_>,
    _resp: &mut crate::http::response::Response,
) {
}

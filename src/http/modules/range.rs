//! `max_ranges` and `Range`/`If-Range`: the range filter (206, multipart, 416).
//!
//! Placeholder: the directive table is empty until the module lands.

use crate::config::registry::Spec;

#[derive(Debug, Clone, Default)]
pub struct RangeLoc {}

impl RangeLoc {
    pub fn merge(&mut self, _p: &RangeLoc) {}
}

pub const DIRECTIVES: &[Spec] = &[];

/// Header filter (see `phases::HEADER_FILTERS` for the order).
pub fn header_filter(
    _cx: &mut crate::http::phases::Ctx<'_>,
    _resp: &mut crate::http::response::Response,
) {
}

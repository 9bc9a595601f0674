//! `add_header`, `add_trailer`, `expires`, `etag`: the headers filter.
//!
//! Placeholder: the directive table is empty until the module lands.

use crate::config::registry::Spec;

#[derive(Debug, Clone, Default)]
pub struct HeadersLoc {
    /// `etag on|off` (default on); read by the static handler.
    pub etag: Option<bool>,
}

impl HeadersLoc {
    pub fn merge(&mut self, p: &HeadersLoc) {
        if self.etag.is_none() {
            self.etag = p.etag;
        }
    }
}

pub const DIRECTIVES: &[Spec] = &[];

/// Header filter (see `phases::HEADER_FILTERS` for the order).
pub fn header_filter(
    _cx: &mut crate::http::phases::Ctx<'_>,
    _resp: &mut crate::http::response::Response,
) {
}

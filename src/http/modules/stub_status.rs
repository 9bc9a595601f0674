//! `stub_status` and `tern_metrics`: status page and Prometheus metrics (content).
//!
//! Placeholder: the directive table is empty until the module lands.

use crate::config::registry::Spec;

#[derive(Debug, Clone, Default)]
pub struct StubStatusLoc {}

impl StubStatusLoc {
    pub fn merge(&mut self, _p: &StubStatusLoc) {}
}

pub const DIRECTIVES: &[Spec] = &[];

/// Content handler: answers when the location has `stub_status` or
/// `tern_metrics`; None lets the next content handler run.
pub fn content(_cx: &mut crate::http::phases::Ctx<'_>) -> Option<crate::http::phases::Step> {
    None
}

/// Module variables (`$connections_active`...).
pub const VARS: &[&str] = &[];

pub fn var(_cx: &crate::http::phases::Ctx<'_>, _i: u8, _out: &mut Vec<u8>) -> bool {
    false
}

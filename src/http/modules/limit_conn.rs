//! `limit_conn_zone`, `limit_conn*`: concurrent connections per key (access phase).
//!
//! Placeholder: the directive table is empty until the module lands.

use crate::config::registry::Spec;

#[derive(Debug, Clone, Default)]
pub struct LimitConnLoc {}

impl LimitConnLoc {
    pub fn merge(&mut self, _p: &LimitConnLoc) {}
}

#[derive(Debug, Clone, Default)]
pub struct LimitConnMain {}

pub const DIRECTIVES: &[Spec] = &[];

/// Access phase handler.
pub fn access(_cx: &mut crate::http::phases::Ctx<'_>) -> crate::http::phases::Step {
    crate::http::phases::Step::Next
}

/// Module variables (`$limit_conn_status`).
pub const VARS: &[&str] = &[];

pub fn var(_cx: &crate::http::phases::Ctx<'_>, _i: u8, _out: &mut Vec<u8>) -> bool {
    false
}

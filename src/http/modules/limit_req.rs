//! `limit_req_zone`, `limit_req*`: request rate per key, leaky bucket (access phase).
//!
//! Placeholder: the directive table is empty until the module lands.

use crate::config::registry::Spec;

#[derive(Debug, Clone, Default)]
pub struct LimitReqLoc {}

impl LimitReqLoc {
    pub fn merge(&mut self, _p: &LimitReqLoc) {}
}

#[derive(Debug, Clone, Default)]
pub struct LimitReqMain {}

pub const DIRECTIVES: &[Spec] = &[];

/// Access phase handler.
pub fn access(_cx: &mut crate::http::phases::Ctx<'_>) -> crate::http::phases::Step {
    crate::http::phases::Step::Next
}

/// Module variables (`$limit_req_status`).
pub const VARS: &[&str] = &[];

pub fn var(_cx: &crate::http::phases::Ctx<'_>, _i: u8, _out: &mut Vec<u8>) -> bool {
    false
}

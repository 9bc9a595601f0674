//! `log_format`, `access_log`, `open_log_file_cache`: the log phase.
//!
//! Placeholder: the directive table is empty until the module lands.

use crate::config::registry::Spec;

#[derive(Debug, Clone, Default)]
pub struct AccessLogLoc {}

impl AccessLogLoc {
    pub fn merge(&mut self, _p: &AccessLogLoc) {}
}

#[derive(Debug, Clone, Default)]
pub struct AccessLogMain {}

pub const DIRECTIVES: &[Spec] = &[];

/// The log phase: writes the request to every access log of its location.
pub fn log(_cx: &crate::http::phases::Ctx<'_>) {}

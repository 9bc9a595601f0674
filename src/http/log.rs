//! Access logging (the log phase). Placeholder until `log_format` and
//! `access_log` land: nothing is written yet.
use crate::http::conn::ConnInfo;
use crate::http::phases::Outcome;
use crate::http::request::Request;

pub fn access(_out: &Outcome, _req: &Request, _info: &ConnInfo) {}

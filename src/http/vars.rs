//! Variables and compiled templates.
//!
//! A string from the config containing `$name`, `${name}` or `$1` is
//! compiled once into a [`Template`]: literal runs and [`Var`] references,
//! builtin variables resolved to an enum, user variables (`set`, `map`,
//! `split_clients`) to an index in the [`VarTable`]. At request time a
//! template renders into a byte buffer through [`VarCtx`], implemented by
//! the request; nothing is looked up by name per request.

use std::collections::HashMap;

use crate::config::{ConfError, ConfResult};

/// A variable reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Var {
    Uri,
    RequestUri,
    Args,
    IsArgs,
    Host,
    Hostname,
    /// `$http_NAME`: header name lowercase with `_` turned into `-`.
    Http(String),
    SentHttp(String),
    /// `$sent_trailer_NAME`: a trailer added before this one (`add_trailer`).
    SentTrailer(String),
    /// `$upstream_http_NAME`: a header of the upstream's response.
    UpstreamHttp(String),
    /// `$upstream_cookie_NAME`: a cookie the upstream's `Set-Cookie` sets.
    UpstreamCookie(String),
    Arg(String),
    Cookie(String),
    RemoteAddr,
    BinaryRemoteAddr,
    RemotePort,
    /// The connection's address and port, whatever realip made of
    /// `$remote_addr`.
    RealIpRemoteAddr,
    RealIpRemotePort,
    ServerAddr,
    ServerPort,
    ServerName,
    ServerProtocol,
    Scheme,
    /// `$https`: "on" over TLS, else "".
    Https,
    /// `$http2`: h2, h2c or empty.
    Http2,
    Http3,
    SslProtocol,
    SslCipher,
    SslServerName,
    SslSessionReused,
    /// The other `$ssl_*` variables (`crate::tls::vars`).
    Ssl(crate::tls::vars::SslVar),
    Request,
    RequestMethod,
    RequestLength,
    RequestTime,
    RequestFilename,
    DocumentRoot,
    RealpathRoot,
    ContentType,
    ContentLength,
    Status,
    BodyBytesSent,
    BytesSent,
    /// `$request_completion`: "OK" once the whole answer was sent.
    RequestCompletion,
    Connection,
    ConnectionRequests,
    /// `$connection_time`: seconds since accept, millisecond resolution.
    ConnectionTime,
    /// `$request_id`: 16 random bytes in hex, fixed for the request.
    RequestId,
    Msec,
    TimeLocal,
    TimeIso8601,
    Pid,
    NginxVersion,
    TernVersion,
    TernIo,
    /// `$1`..`$9` regex captures.
    Capture(usize),
    /// A user variable by index in the [`VarTable`].
    User(usize),
    /// A variable a module provides (`$limit_conn_status`, `$gzip_ratio`...),
    /// by the module's own id (see `modules::module_var_by_name`).
    Module(u16),
    /// `$proxy_protocol_addr`, `_port`, `_server_addr`, `_server_port`,
    /// `_tlv_NAME`: from the connection's PROXY header.
    ProxyProtocol(crate::core::proxy_protocol::PpVar),
    /// A variable only the stream module has (`$bytes_received`,
    /// `$upstream_connect_time`...), by [`crate::stream::vars::SVar`].
    Stream(crate::stream::vars::SVar),
}

/// How a user variable gets its value when `set` did not give one
/// (`map`, `split_clients`, ...).
pub trait UserVar: std::fmt::Debug + Send + Sync {
    /// Appends the value; false when the variable has no value.
    fn eval(&self, cx: &dyn VarCtx, out: &mut Vec<u8>) -> bool;

    /// A value found once holds for the rest of the request (nginx's
    /// cached variables: a `map` without `volatile`).
    fn cacheable(&self) -> bool {
        false
    }
}

/// Builtins by name (those without a prefix).
fn builtin(name: &str) -> Option<Var> {
    Some(match name {
        "uri" | "document_uri" => Var::Uri,
        "request_uri" => Var::RequestUri,
        "args" | "query_string" => Var::Args,
        "is_args" => Var::IsArgs,
        "host" => Var::Host,
        "hostname" => Var::Hostname,
        "remote_addr" => Var::RemoteAddr,
        "binary_remote_addr" => Var::BinaryRemoteAddr,
        "remote_port" => Var::RemotePort,
        "realip_remote_addr" => Var::RealIpRemoteAddr,
        "realip_remote_port" => Var::RealIpRemotePort,
        "server_addr" => Var::ServerAddr,
        "server_port" => Var::ServerPort,
        "server_name" => Var::ServerName,
        "server_protocol" => Var::ServerProtocol,
        "scheme" => Var::Scheme,
        "https" => Var::Https,
        "http2" => Var::Http2,
        "http3" => Var::Http3,
        "ssl_protocol" => Var::SslProtocol,
        "ssl_cipher" => Var::SslCipher,
        "ssl_server_name" => Var::SslServerName,
        "ssl_session_reused" => Var::SslSessionReused,
        "request" => Var::Request,
        "request_method" => Var::RequestMethod,
        "request_length" => Var::RequestLength,
        "request_time" => Var::RequestTime,
        "request_filename" => Var::RequestFilename,
        "document_root" => Var::DocumentRoot,
        "realpath_root" => Var::RealpathRoot,
        "content_type" => Var::ContentType,
        "content_length" => Var::ContentLength,
        "status" => Var::Status,
        "body_bytes_sent" => Var::BodyBytesSent,
        "bytes_sent" => Var::BytesSent,
        "request_completion" => Var::RequestCompletion,
        "connection" => Var::Connection,
        "connection_requests" => Var::ConnectionRequests,
        "connection_time" => Var::ConnectionTime,
        "request_id" => Var::RequestId,
        "msec" => Var::Msec,
        "time_local" => Var::TimeLocal,
        "time_iso8601" => Var::TimeIso8601,
        "pid" => Var::Pid,
        "nginx_version" => Var::NginxVersion,
        "tern_version" => Var::TernVersion,
        "tern_io" => Var::TernIo,
        _ => return crate::tls::vars::by_name(name).map(Var::Ssl),
    })
}

/// User-defined variables of an http block.
#[derive(Debug, Clone, Default)]
pub struct VarTable {
    names: Vec<String>,
    index: HashMap<String, usize>,
    defined: Vec<bool>,
    defs: Vec<Option<std::sync::Arc<dyn UserVar>>>,
    /// Declared by `set`: without a value in a request such a variable is
    /// "uninitialized" (empty, with nginx's warning).
    by_set: Vec<bool>,
    /// A prefix variable (`$http_foo`...) that `set` also gives values
    /// to: where `set` has not run in a request, the prefix variable
    /// answers, as in nginx.
    fallback: HashMap<usize, Var>,
    /// Where a variable was first mentioned (file, line), for the
    /// `unknown "NAME" variable` error.
    first_use: Vec<Option<(std::sync::Arc<std::path::PathBuf>, usize)>>,
    /// Some template mentions `$upstream_http_NAME`: the proxy keeps the
    /// upstream's header lines for the request (else it need not).
    pub upstream_http: bool,
    /// The table of a `stream {}` block: names resolve to the stream
    /// module's variables ([`crate::stream::vars::builtin`]), never to
    /// http's.
    pub stream: bool,
}

impl VarTable {
    /// An empty table of a `stream {}` block.
    pub fn for_stream() -> VarTable {
        VarTable {
            stream: true,
            ..Default::default()
        }
    }

    /// The index of a user variable, created on first mention.
    pub fn user(&mut self, name: &str) -> usize {
        if let Some(i) = self.index.get(name) {
            return *i;
        }
        let i = self.names.len();
        self.names.push(name.to_string());
        self.defined.push(false);
        self.defs.push(None);
        self.by_set.push(false);
        self.first_use.push(None);
        self.index.insert(name.to_string(), i);
        i
    }

    /// Records `d` as the first mention of the variables created since
    /// the table had `from` of them.
    pub fn mentioned_since(&mut self, from: usize, d: &crate::config::Directive) {
        for slot in self.first_use.iter_mut().skip(from) {
            if slot.is_none() {
                *slot = Some((d.file.clone(), d.line));
            }
        }
    }

    /// Declares a user variable (by `set`, `map`, ...).
    pub fn define(&mut self, name: &str) -> usize {
        let i = self.user(name);
        self.defined[i] = true;
        i
    }

    /// Declares a variable `set` gives a value to.
    pub fn define_set(&mut self, name: &str) -> usize {
        let mut probe = VarTable {
            stream: self.stream,
            ..Default::default()
        };
        let prefixed = match probe.resolve(name) {
            Var::User(_) => None,
            v => Some(v),
        };
        let i = self.define(name);
        self.by_set[i] = true;
        if let Some(v) = prefixed {
            self.fallback.insert(i, v);
        }
        i
    }

    /// The prefix variable a `set` variable falls back to (see `fallback`).
    pub fn fallback(&self, i: usize) -> Option<&Var> {
        self.fallback.get(&i)
    }

    /// Whether user variable `i` is declared by `set` and computed by
    /// nothing else: where `set` has not run, nginx's rewrite module gives
    /// it an empty value and warns (`uninitialized_variable_warn`).
    pub fn set_only(&self, i: usize) -> bool {
        self.by_set.get(i).copied().unwrap_or(false) && self.def(i).is_none()
    }

    /// Declares a computed variable (`map`, `split_clients`); a name may
    /// be computed by only one of them.
    pub fn define_computed(
        &mut self,
        name: &str,
        def: std::sync::Arc<dyn UserVar>,
    ) -> Result<usize, String> {
        let i = self.define(name);
        if self.defs[i].is_some() {
            return Err(format!("the duplicate \"{}\" variable", name));
        }
        self.defs[i] = Some(def);
        Ok(i)
    }

    /// The computed definition of user variable `i`, if any.
    pub fn def(&self, i: usize) -> Option<&std::sync::Arc<dyn UserVar>> {
        self.defs.get(i).and_then(Option::as_ref)
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    pub fn name(&self, i: usize) -> &str {
        self.names.get(i).map(String::as_str).unwrap_or("")
    }

    /// Every variable mentioned must be defined somewhere (nginx checks this
    /// after reading the whole configuration). nginx names no place for
    /// the error; tern names the first mention (see DIFFERENCES.md).
    pub fn finish(&self) -> ConfResult<()> {
        for (i, d) in self.defined.iter().enumerate() {
            if !d {
                let mut e = ConfError::new(format!("unknown \"{}\" variable", self.names[i]));
                if let Some(Some((file, line))) = self.first_use.get(i) {
                    e.file = Some((**file).clone());
                    e.line = *line;
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Resolves a name without creating a user variable.
    pub fn lookup(&self, name: &str) -> Option<Var> {
        if let Some(i) = self.index.get(name) {
            return Some(Var::User(*i));
        }
        let mut probe = VarTable {
            stream: self.stream,
            ..Default::default()
        };
        match probe.resolve(name) {
            Var::User(_) => None,
            v => Some(v),
        }
    }

    /// Resolves a name to a variable.
    pub fn resolve(&mut self, name: &str) -> Var {
        if self.stream {
            return match crate::stream::vars::builtin(name) {
                Some(v) => v,
                None => Var::User(self.user(name)),
            };
        }
        if let Some(v) = builtin(name) {
            return v;
        }
        // A prefix variable that `set` gives values to is that variable.
        if let Some(&i) = self.index.get(name) {
            if self.fallback.contains_key(&i) {
                return Var::User(i);
            }
        }
        let lower = name.to_ascii_lowercase();
        if let Some(h) = lower.strip_prefix("http_") {
            return Var::Http(h.replace('_', "-"));
        }
        if let Some(c) = name.strip_prefix("upstream_cookie_") {
            self.upstream_http = true;
            return Var::UpstreamCookie(c.to_string());
        }
        if let Some(h) = lower.strip_prefix("upstream_http_") {
            self.upstream_http = true;
            return Var::UpstreamHttp(h.replace('_', "-"));
        }
        if let Some(h) = lower.strip_prefix("sent_http_") {
            return Var::SentHttp(h.replace('_', "-"));
        }
        if let Some(h) = lower.strip_prefix("sent_trailer_") {
            return Var::SentTrailer(h.replace('_', "-"));
        }
        if let Some(a) = name.strip_prefix("arg_") {
            return Var::Arg(a.to_string());
        }
        if let Some(c) = name.strip_prefix("cookie_") {
            return Var::Cookie(c.to_string());
        }
        if let Some(m) = crate::http::modules::module_var_by_name(name) {
            return Var::Module(m);
        }
        if let Some(p) = crate::core::proxy_protocol::PpVar::by_name(name) {
            return Var::ProxyProtocol(p);
        }
        Var::User(self.user(name))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Lit(Vec<u8>),
    Var(Var),
}

/// A compiled string with variables.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Template {
    pub parts: Vec<Part>,
}

/// What a template needs from the request to render.
pub trait VarCtx {
    /// Appends the value of `v`; returns false when the variable is not found
    /// (an empty value is appended then).
    fn var(&self, v: &Var, out: &mut Vec<u8>) -> bool;
}

impl Template {
    pub fn literal(s: &str) -> Template {
        Template {
            parts: vec![Part::Lit(s.as_bytes().to_vec())],
        }
    }

    /// Compiles `s`; errors are nginx's messages (without location).
    pub fn compile(s: &str, vars: &mut VarTable) -> Result<Template, String> {
        Self::compile_with(s, &mut |n| Some(vars.resolve(n)))
    }

    /// Compiles against an existing table without adding to it (unknown
    /// variables are an error).
    pub fn compile_existing(s: &str, vars: &VarTable) -> Result<Template, String> {
        Self::compile_with(s, &mut |n| vars.lookup(n))
    }

    fn compile_with(
        s: &str,
        resolve: &mut dyn FnMut(&str) -> Option<Var>,
    ) -> Result<Template, String> {
        let b = s.as_bytes();
        let mut parts = Vec::new();
        let mut lit = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if b[i] != b'$' {
                lit.push(b[i]);
                i += 1;
                continue;
            }
            i += 1;
            let (name, next) = if b.get(i) == Some(&b'{') {
                let Some(end) = b[i + 1..].iter().position(|&c| c == b'}') else {
                    return Err(format!(
                        "the closing bracket in \"{}\" variable is missing",
                        &s[i + 1..]
                    ));
                };
                (&s[i + 1..i + 1 + end], i + end + 2)
            } else if b.get(i).is_some_and(u8::is_ascii_digit) {
                (&s[i..i + 1], i + 1)
            } else {
                let end = b[i..]
                    .iter()
                    .position(|&c| !(c.is_ascii_alphanumeric() || c == b'_'))
                    .map_or(b.len(), |p| i + p);
                (&s[i..end], end)
            };
            if name.is_empty() {
                return Err(format!("invalid variable name in \"{}\"", s));
            }
            if !lit.is_empty() {
                parts.push(Part::Lit(std::mem::take(&mut lit)));
            }
            let v = match name.parse::<usize>() {
                Ok(n) => Var::Capture(n),
                Err(_) => resolve(name).ok_or_else(|| format!("unknown \"{}\" variable", name))?,
            };
            parts.push(Part::Var(v));
            i = next;
        }
        if !lit.is_empty() {
            parts.push(Part::Lit(lit));
        }
        Ok(Template { parts })
    }

    pub fn has_vars(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Var(_)))
    }

    /// The literal value when the template has no variables.
    pub fn as_literal(&self) -> Option<&[u8]> {
        match self.parts.as_slice() {
            [] => Some(b""),
            [Part::Lit(l)] => Some(l),
            _ => None,
        }
    }

    pub fn render(&self, cx: &dyn VarCtx, out: &mut Vec<u8>) {
        for p in &self.parts {
            match p {
                Part::Lit(l) => out.extend_from_slice(l),
                Part::Var(v) => {
                    cx.var(v, out);
                }
            }
        }
    }

    /// The bytes of the literal parts (what a render writes at least).
    pub fn literal_len(&self) -> usize {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Lit(l) => l.len(),
                Part::Var(_) => 0,
            })
            .sum()
    }

    pub fn render_vec(&self, cx: &dyn VarCtx) -> Vec<u8> {
        let mut v = Vec::new();
        self.render(cx, &mut v);
        v
    }
}

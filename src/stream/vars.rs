//! The stream module's variables.
//!
//! A `stream {}` block compiles its strings against its own
//! [`VarTable`](crate::http::vars::VarTable) in stream mode: names resolve
//! here ([`builtin`]) and otherwise to user variables (`set`, `map`,
//! `geo`, `split_clients`). Variables that mean the same in http and
//! stream (`$remote_addr`, `$status`, `$msec`...) reuse http's [`Var`]
//! variants; those only stream has are [`SVar`]s. A session renders them
//! through its [`VarCtx`](crate::http::vars::VarCtx) implementation in
//! [`super::session`]; nothing is looked up by name per session.

use crate::http::vars::Var;

/// Variables only the stream module has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SVar {
    BytesReceived,
    SessionTime,
    Protocol,
    UpstreamAddr,
    UpstreamBytesSent,
    UpstreamBytesReceived,
    UpstreamConnectTime,
    UpstreamFirstByteTime,
    UpstreamSessionTime,
    LimitConnStatus,
    SslPrereadServerName,
    SslPrereadAlpnProtocols,
    SslPrereadProtocol,
    SslAlpnProtocol,
}

/// The stream module's builtin variables by name.
pub fn builtin(name: &str) -> Option<Var> {
    Some(match name {
        "remote_addr" => Var::RemoteAddr,
        "binary_remote_addr" => Var::BinaryRemoteAddr,
        "remote_port" => Var::RemotePort,
        "realip_remote_addr" => Var::RealIpRemoteAddr,
        "realip_remote_port" => Var::RealIpRemotePort,
        "server_addr" => Var::ServerAddr,
        "server_port" => Var::ServerPort,
        "bytes_sent" => Var::BytesSent,
        "status" => Var::Status,
        "connection" => Var::Connection,
        "msec" => Var::Msec,
        "time_local" => Var::TimeLocal,
        "time_iso8601" => Var::TimeIso8601,
        "pid" => Var::Pid,
        "hostname" => Var::Hostname,
        "nginx_version" => Var::NginxVersion,
        "tern_version" => Var::TernVersion,
        "bytes_received" => Var::Stream(SVar::BytesReceived),
        "session_time" => Var::Stream(SVar::SessionTime),
        "protocol" => Var::Stream(SVar::Protocol),
        "upstream_addr" => Var::Stream(SVar::UpstreamAddr),
        "upstream_bytes_sent" => Var::Stream(SVar::UpstreamBytesSent),
        "upstream_bytes_received" => Var::Stream(SVar::UpstreamBytesReceived),
        "upstream_connect_time" => Var::Stream(SVar::UpstreamConnectTime),
        "upstream_first_byte_time" => Var::Stream(SVar::UpstreamFirstByteTime),
        "upstream_session_time" => Var::Stream(SVar::UpstreamSessionTime),
        "limit_conn_status" => Var::Stream(SVar::LimitConnStatus),
        "ssl_preread_server_name" => Var::Stream(SVar::SslPrereadServerName),
        "ssl_preread_alpn_protocols" => Var::Stream(SVar::SslPrereadAlpnProtocols),
        "ssl_preread_protocol" => Var::Stream(SVar::SslPrereadProtocol),
        "ssl_alpn_protocol" => Var::Stream(SVar::SslAlpnProtocol),
        "ssl_protocol" => Var::SslProtocol,
        "ssl_cipher" => Var::SslCipher,
        "ssl_server_name" => Var::SslServerName,
        "ssl_session_reused" => Var::SslSessionReused,
        "server_name" => Var::ServerName,
        _ => {
            // `$proxy_protocol_*`, with `_tlv_NAME` (nginx 1.23.2), as http.
            if let Some(p) = crate::core::proxy_protocol::PpVar::by_name(name) {
                return Some(Var::ProxyProtocol(p));
            }
            return crate::tls::vars::by_name(name).map(Var::Ssl);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::vars::{Template, VarTable};

    #[test]
    fn stream_table_resolves_stream_names() {
        let mut t = VarTable::for_stream();
        let tpl = Template::compile("$bytes_received $uri", &mut t).expect("compiles");
        assert!(tpl
            .parts
            .contains(&crate::http::vars::Part::Var(Var::Stream(
                SVar::BytesReceived
            ))));
        // `$uri` is no stream variable: a user variable, unknown unless defined.
        assert!(t.finish().is_err());
    }
}

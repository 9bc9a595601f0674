//! The `$ssl_*` variables beyond the four the engine resolves itself
//! (`$ssl_protocol`, `$ssl_cipher`, `$ssl_server_name`,
//! `$ssl_session_reused`): resolved by name once when a template
//! compiles, evaluated from the connection's [`TlsInfo`].
//!
//! On a plain connection none of them is found (an empty value), as in
//! nginx; on a TLS connection without a client certificate the
//! certificate ones are empty and `$ssl_client_verify` is `NONE`.

use x509_parser::prelude::*;

use crate::tls::{group_name, x509, TlsInfo};

/// One of the variables this module provides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslVar {
    SessionId,
    Ciphers,
    Curve,
    Curves,
    ClientVerify,
    ClientSDn,
    ClientIDn,
    ClientSDnLegacy,
    ClientIDnLegacy,
    ClientSerial,
    ClientFingerprint,
    ClientCert,
    ClientRawCert,
    ClientEscapedCert,
    ClientVStart,
    ClientVEnd,
    ClientVRemain,
    EarlyData,
}

/// The variable named `name` (without the `$`).
pub fn by_name(name: &str) -> Option<SslVar> {
    use SslVar::*;
    Some(match name {
        "ssl_session_id" => SessionId,
        "ssl_ciphers" => Ciphers,
        "ssl_curve" => Curve,
        "ssl_curves" => Curves,
        "ssl_client_verify" => ClientVerify,
        "ssl_client_s_dn" => ClientSDn,
        "ssl_client_i_dn" => ClientIDn,
        "ssl_client_s_dn_legacy" => ClientSDnLegacy,
        "ssl_client_i_dn_legacy" => ClientIDnLegacy,
        "ssl_client_serial" => ClientSerial,
        "ssl_client_fingerprint" => ClientFingerprint,
        "ssl_client_cert" => ClientCert,
        "ssl_client_raw_cert" => ClientRawCert,
        "ssl_client_escaped_cert" => ClientEscapedCert,
        "ssl_client_v_start" => ClientVStart,
        "ssl_client_v_end" => ClientVEnd,
        "ssl_client_v_remain" => ClientVRemain,
        "ssl_early_data" => EarlyData,
        _ => return None,
    })
}

fn push_hex16(v: u16, out: &mut Vec<u8>) {
    out.extend_from_slice(format!("0x{:04x}", v).as_bytes());
}

/// Appends the value; false when the variable is not found.
pub fn eval(info: Option<&TlsInfo>, v: SslVar, out: &mut Vec<u8>) -> bool {
    let Some(t) = info else {
        return false;
    };
    match v {
        SslVar::SessionId => x509::hex_lower(&t.session_id, out),
        SslVar::Ciphers => {
            for (i, c) in t.client_ciphers.iter().enumerate() {
                if i > 0 {
                    out.push(b':');
                }
                match crate::tls::config::openssl_name(*c) {
                    Some(n) => out.extend_from_slice(n.as_bytes()),
                    None => push_hex16(u16::from(*c), out),
                }
            }
        }
        SslVar::Curve => {
            if let Some(g) = t.curve {
                match group_name(g) {
                    Some(n) => out.extend_from_slice(n.as_bytes()),
                    None => push_hex16(u16::from(g), out),
                }
            }
        }
        SslVar::Curves => {
            for (i, g) in t.client_groups.iter().enumerate() {
                if i > 0 {
                    out.push(b':');
                }
                match group_name(*g) {
                    Some(n) => out.extend_from_slice(n.as_bytes()),
                    None => push_hex16(u16::from(*g), out),
                }
            }
        }
        SslVar::ClientVerify => match (&t.verify, &t.client_chain) {
            (Err(e), _) => {
                out.extend_from_slice(b"FAILED:");
                out.extend_from_slice(e.1.as_bytes());
            }
            (Ok(()), Some(_)) => out.extend_from_slice(b"SUCCESS"),
            (Ok(()), None) => out.extend_from_slice(b"NONE"),
        },
        // Over TCP rustls accepts no early data (see DIFFERENCES.md);
        // over QUIC, "1" for a request that came in 0-RTT.
        SslVar::EarlyData => {
            if t.early_data {
                out.push(b'1');
            }
        }
        _ => {
            let Some(der) = t.client_chain.as_ref().and_then(|c| c.first()) else {
                return true;
            };
            cert_var(der, v, out);
        }
    }
    true
}

fn cert_var(der: &[u8], v: SslVar, out: &mut Vec<u8>) {
    match v {
        SslVar::ClientRawCert => return out.extend_from_slice(&x509::pem(der)),
        SslVar::ClientCert => return x509::pem_tabbed(der, out),
        SslVar::ClientEscapedCert => return x509::pem_escaped(der, out),
        SslVar::ClientFingerprint => return x509::fingerprint(der, out),
        _ => {}
    }
    let Ok((_, c)) = X509Certificate::from_der(der) else {
        return;
    };
    match v {
        SslVar::ClientSDn => x509::dn_rfc2253(c.subject(), out),
        SslVar::ClientIDn => x509::dn_rfc2253(c.issuer(), out),
        SslVar::ClientSDnLegacy => x509::dn_legacy(c.subject(), out),
        SslVar::ClientIDnLegacy => x509::dn_legacy(c.issuer(), out),
        SslVar::ClientSerial => x509::serial(&c, out),
        SslVar::ClientVStart => x509::time(c.validity().not_before.timestamp(), out),
        SslVar::ClientVEnd => x509::time(c.validity().not_after.timestamp(), out),
        SslVar::ClientVRemain => {
            let now = crate::http::date::now_secs();
            let end = c.validity().not_after.timestamp();
            let days = if end < now + 86400 {
                0
            } else {
                (end - now) / 86400
            };
            out.extend_from_slice(days.to_string().as_bytes());
        }
        _ => {}
    }
}

//! `ssl_conf_command NAME VALUE`: OpenSSL's SSL_CONF commands, mapped onto
//! the rustls configuration where they mean something there.
//!
//! nginx hands each command to OpenSSL's `SSL_CONF_cmd` after all its own
//! settings, so a command overrides the directive that says the same
//! thing (`Options -ServerPreference` beats `ssl_prefer_server_ciphers
//! on`). tern parses the commands when the directive is read (an unknown
//! command or a bad value is nginx's `SSL_CONF_cmd(...) failed` error) and
//! [`crate::tls::config::build`] applies them in the same order, last:
//!
//! - `Certificate` / `PrivateKey`: a pair (the n-th of each), which takes
//!   the place of the server's pair with the same key type (OpenSSL keeps
//!   one certificate per key type), or is added.
//! - `Options`: `SessionTicket` (`ssl_session_tickets`),
//!   `ServerPreference` (`ssl_prefer_server_ciphers`); the others are
//!   rustls's fixed behaviour or mean nothing to it: warned about.
//! - `Protocol`, `MinProtocol`, `MaxProtocol`: TLSv1.2 and TLSv1.3.
//! - `CipherString` (`ssl_ciphers`), `Ciphersuites` (the TLS 1.3 suites, in
//!   the given order), `Groups`/`Curves`/`ECDHParameters`
//!   (`ssl_ecdh_curve`), `NumTickets` (TLS 1.3 tickets per handshake).
//! - Every other command OpenSSL knows (`SignatureAlgorithms`,
//!   `VerifyCAFile`, `DHParameters`, ...) is accepted with a warning that
//!   it is not applied.

use crate::config::{ConfError, ConfResult};

/// One command, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cmd {
    Certificate(String),
    PrivateKey(String),
    /// `Options SessionTicket` / `-SessionTicket`.
    SessionTicket(bool),
    /// `Options ServerPreference` / `-ServerPreference`.
    ServerPreference(bool),
    /// `Protocol`: (name, on) for TLSv1.2 / TLSv1.3 (the older names and
    /// `ALL` are folded in when parsed).
    Protocol {
        tls12: Option<bool>,
        tls13: Option<bool>,
    },
    /// `MinProtocol` / `MaxProtocol`: 0 = none, 2 = TLSv1.2, 3 = TLSv1.3,
    /// 1 = anything older.
    MinProtocol(u8),
    MaxProtocol(u8),
    CipherString(String),
    /// TLS 1.3 suites in order (those rustls lacks dropped).
    Ciphersuites(Vec<rustls::CipherSuite>),
    Groups(String),
    NumTickets(usize),
}

/// OpenSSL 3.0's commands for configuration files (names are matched
/// without regard to case, as `SSL_CONF_FLAG_FILE` does).
const KNOWN: &[&str] = &[
    "SignatureAlgorithms",
    "ClientSignatureAlgorithms",
    "Curves",
    "Groups",
    "ECDHParameters",
    "CipherString",
    "Ciphersuites",
    "Protocol",
    "MinProtocol",
    "MaxProtocol",
    "Options",
    "VerifyMode",
    "Certificate",
    "PrivateKey",
    "ServerInfoFile",
    "ChainCAPath",
    "ChainCAFile",
    "ChainCAStore",
    "VerifyCAPath",
    "VerifyCAFile",
    "VerifyCAStore",
    "RequestCAFile",
    "ClientCAFile",
    "RequestCAPath",
    "ClientCAPath",
    "RequestCAStore",
    "ClientCAStore",
    "DHParameters",
    "RecordPadding",
    "NumTickets",
];

/// OpenSSL 3.0's `Options` words; SessionTicket and ServerPreference are
/// applied, the others are not (rustls never compresses, renegotiates,
/// or speaks CBC; it always does what MiddleboxCompat, ExtendedMasterSecret
/// and AntiReplay ask).
const OPTIONS: &[&str] = &[
    "SessionTicket",
    "EmptyFragments",
    "Bugs",
    "Compression",
    "ServerPreference",
    "NoResumptionOnRenegotiation",
    "DHSingle",
    "ECDHSingle",
    "UnsafeLegacyRenegotiation",
    "UnsafeLegacyServerConnect",
    "EncryptThenMac",
    "NoRenegotiation",
    "AllowNoDHEKEX",
    "PrioritizeChaCha",
    "MiddleboxCompat",
    "AntiReplay",
    "ExtendedMasterSecret",
    "CANames",
    "KTLS",
    "ClientRenegotiation",
    "LegacyServerConnect",
    "IgnoreUnexpectedEOF",
    "AllowClientRenegotiation",
];

fn failed(name: &str, value: &str, why: &str) -> ConfError {
    ConfError::new(format!(
        "SSL_CONF_cmd(\"{}\", \"{}\") failed ({})",
        name, value, why
    ))
}

fn bad_value(name: &str, value: &str) -> ConfError {
    failed(
        name,
        value,
        &format!("bad value:cmd={}, value={}", name, value),
    )
}

/// A protocol name's rank (`MinProtocol`, `MaxProtocol`).
fn rank(v: &str) -> Option<u8> {
    Some(match v {
        "None" => 0,
        "SSLv3" | "TLSv1" | "TLSv1.1" | "DTLSv1" => 1,
        "TLSv1.2" | "DTLSv1.2" => 2,
        "TLSv1.3" => 3,
        _ => return None,
    })
}

/// Checks one `ssl_conf_command` (names relative to `prefix` for the
/// files): the commands to apply (none for one rustls cannot honour),
/// and warnings about what is not applied.
pub fn parse(
    name: &str,
    value: &str,
    prefix: &std::path::Path,
) -> ConfResult<(Vec<Cmd>, Vec<String>)> {
    let Some(known) = KNOWN.iter().find(|k| k.eq_ignore_ascii_case(name)) else {
        return Err(failed(
            name,
            value,
            &format!("unknown cmd name:cmd={}", name),
        ));
    };
    let path = |v: &str| {
        if v.starts_with('/') {
            v.to_string()
        } else {
            prefix.join(v).to_string_lossy().into_owned()
        }
    };
    let not_applied = |why: &str| {
        format!(
            "\"ssl_conf_command {} {}\" is not applied: {}",
            name, value, why
        )
    };
    let mut cmds = Vec::new();
    let mut warn = Vec::new();
    match *known {
        "Certificate" => cmds.push(Cmd::Certificate(path(value))),
        "PrivateKey" => cmds.push(Cmd::PrivateKey(path(value))),
        "CipherString" => {
            crate::tls::config::tls12_suites(value).map_err(|_| bad_value(name, value))?;
            cmds.push(Cmd::CipherString(value.to_string()));
        }
        "Ciphersuites" => {
            let mut out = Vec::new();
            for n in value.split(':').filter(|n| !n.is_empty()) {
                use rustls::CipherSuite as C;
                let s = match n {
                    "TLS_AES_128_GCM_SHA256" => C::TLS13_AES_128_GCM_SHA256,
                    "TLS_AES_256_GCM_SHA384" => C::TLS13_AES_256_GCM_SHA384,
                    "TLS_CHACHA20_POLY1305_SHA256" => C::TLS13_CHACHA20_POLY1305_SHA256,
                    // OpenSSL has them, rustls does not: dropped.
                    "TLS_AES_128_CCM_SHA256" | "TLS_AES_128_CCM_8_SHA256" => continue,
                    _ => {
                        return Err(failed(
                            name,
                            value,
                            &format!("no cipher match, bad value:cmd={}, value={}", name, value),
                        ))
                    }
                };
                if !out.contains(&s) {
                    out.push(s);
                }
            }
            cmds.push(Cmd::Ciphersuites(out));
        }
        "Groups" | "Curves" => {
            crate::tls::config::check_groups(value).map_err(|_| bad_value(name, value))?;
            cmds.push(Cmd::Groups(value.to_string()));
        }
        "ECDHParameters" => {
            let v = if value.eq_ignore_ascii_case("automatic") || value.eq_ignore_ascii_case("auto")
            {
                "auto"
            } else {
                value
            };
            crate::tls::config::check_groups(v).map_err(|_| bad_value(name, value))?;
            cmds.push(Cmd::Groups(v.to_string()));
        }
        "NumTickets" => {
            let n = value.parse::<usize>().map_err(|_| bad_value(name, value))?;
            cmds.push(Cmd::NumTickets(n));
        }
        "MinProtocol" | "MaxProtocol" => {
            let r = rank(value).ok_or_else(|| bad_value(name, value))?;
            cmds.push(if *known == "MinProtocol" {
                Cmd::MinProtocol(r)
            } else {
                Cmd::MaxProtocol(r)
            });
        }
        "Protocol" => {
            let (mut tls12, mut tls13) = (None, None);
            for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
                let (on, n) = match item.strip_prefix('-') {
                    Some(n) => (false, n),
                    None => (true, item.strip_prefix('+').unwrap_or(item)),
                };
                match n {
                    "ALL" => {
                        tls12 = Some(on);
                        tls13 = Some(on);
                    }
                    "TLSv1.2" => tls12 = Some(on),
                    "TLSv1.3" => tls13 = Some(on),
                    "SSLv2" | "SSLv3" | "TLSv1" | "TLSv1.1" | "DTLSv1" | "DTLSv1.2" => {}
                    _ => return Err(bad_value(name, value)),
                }
            }
            cmds.push(Cmd::Protocol { tls12, tls13 });
        }
        "Options" => {
            for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
                let (on, n) = match item.strip_prefix('-') {
                    Some(n) => (false, n),
                    None => (true, item),
                };
                let Some(opt) = OPTIONS.iter().find(|o| o.eq_ignore_ascii_case(n)) else {
                    return Err(bad_value(name, value));
                };
                match *opt {
                    "SessionTicket" => cmds.push(Cmd::SessionTicket(on)),
                    "ServerPreference" => cmds.push(Cmd::ServerPreference(on)),
                    other => warn.push(not_applied(&format!("rustls has no option \"{}\"", other))),
                }
            }
        }
        other => warn.push(not_applied(&format!(
            "rustls has no equivalent of \"{}\"",
            other
        ))),
    }
    Ok((cmds, warn))
}

/// What the commands change in a server's rustls configuration (see
/// `tls::config::build`), with the server's own settings as the start.
#[derive(Debug, Clone)]
pub struct Effect {
    /// (TLSv1.2, TLSv1.3) wanted.
    pub protocols: (bool, bool),
    pub ciphers: Option<String>,
    pub tls13_suites: Option<Vec<rustls::CipherSuite>>,
    pub groups: Option<String>,
    pub tickets: Option<bool>,
    pub server_preference: Option<bool>,
    pub num_tickets: Option<usize>,
    /// `Certificate`/`PrivateKey` pairs, in order.
    pub pairs: Vec<(String, String)>,
}

/// Folds the commands, in order, over the server's protocols.
pub fn effect(cmds: &[Cmd], protocols: (bool, bool)) -> ConfResult<Effect> {
    let mut e = Effect {
        protocols,
        ciphers: None,
        tls13_suites: None,
        groups: None,
        tickets: None,
        server_preference: None,
        num_tickets: None,
        pairs: Vec::new(),
    };
    let (mut certs, mut keys) = (Vec::new(), Vec::new());
    for c in cmds {
        match c {
            Cmd::Certificate(p) => certs.push(p.clone()),
            Cmd::PrivateKey(p) => keys.push(p.clone()),
            Cmd::SessionTicket(on) => e.tickets = Some(*on),
            Cmd::ServerPreference(on) => e.server_preference = Some(*on),
            Cmd::Protocol { tls12, tls13 } => {
                if let Some(v) = tls12 {
                    e.protocols.0 = *v;
                }
                if let Some(v) = tls13 {
                    e.protocols.1 = *v;
                }
            }
            Cmd::MinProtocol(r) => {
                if *r > 2 {
                    e.protocols.0 = false;
                }
            }
            Cmd::MaxProtocol(r) => {
                if *r != 0 && *r < 3 {
                    e.protocols.1 = false;
                }
                if *r != 0 && *r < 2 {
                    e.protocols.0 = false;
                }
            }
            Cmd::CipherString(s) => e.ciphers = Some(s.clone()),
            Cmd::Ciphersuites(s) => e.tls13_suites = Some(s.clone()),
            Cmd::Groups(g) => e.groups = Some(g.clone()),
            Cmd::NumTickets(n) => e.num_tickets = Some(*n),
        }
    }
    if certs.len() != keys.len() {
        let (what, other) = if certs.len() > keys.len() {
            ("Certificate", "PrivateKey")
        } else {
            ("PrivateKey", "Certificate")
        };
        return Err(ConfError::new(format!(
            "\"ssl_conf_command {}\" needs an \"ssl_conf_command {}\" of its own in tern \
             (each Certificate is paired with the PrivateKey of the same rank)",
            what, other
        )));
    }
    e.pairs = certs.into_iter().zip(keys).collect();
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(n: &str, v: &str) -> ConfResult<(Vec<Cmd>, Vec<String>)> {
        parse(n, v, std::path::Path::new("/conf"))
    }

    #[test]
    fn commands() {
        assert_eq!(
            p("Options", "SessionTicket").unwrap().0,
            [Cmd::SessionTicket(true)]
        );
        let (c, w) = p("options", "-ServerPreference,PrioritizeChaCha").unwrap();
        assert_eq!(c, [Cmd::ServerPreference(false)]);
        assert_eq!(w.len(), 1);
        assert_eq!(
            p("Certificate", "a.crt").unwrap().0,
            [Cmd::Certificate("/conf/a.crt".into())]
        );
        assert!(p("Foo", "bar")
            .unwrap_err()
            .msg
            .contains("SSL_CONF_cmd(\"Foo\", \"bar\") failed"));
        assert!(p("Options", "Bogus").is_err());
        assert!(p("MinProtocol", "TLSv1.9").is_err());
        assert!(p("Ciphersuites", "TLS_FOO").is_err());
        assert!(p("Groups", "P-999").is_err());
        assert_eq!(p("SignatureAlgorithms", "RSA+SHA256").unwrap().1.len(), 1);
        let cmds: Vec<Cmd> = [
            ("Protocol", "-TLSv1.2,TLSv1.3"),
            ("MaxProtocol", "TLSv1.3"),
            ("Options", "-SessionTicket"),
        ]
        .iter()
        .flat_map(|(n, v)| p(n, v).unwrap().0)
        .collect();
        let e = effect(&cmds, (true, false)).unwrap();
        assert_eq!(e.protocols, (false, true));
        assert_eq!(e.tickets, Some(false));
        assert!(effect(&[Cmd::Certificate("x".into())], (true, true)).is_err());
    }
}

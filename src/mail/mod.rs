//! The `mail` module: nginx's POP3, IMAP and SMTP proxy (`mail {}`:
//! ngx_mail_core, auth_http, proxy, pop3, imap, smtp, ssl, realip).
//!
//! - [`conf`]: the directive table and the compiled [`conf::MailConf`]
//!   (one server per listening address).
//! - [`session`]: one client connection, from accept to close: PROXY
//!   header and `set_real_ip_from`, the TLS handshake of a `listen ... ssl`
//!   address, then the protocol's login dialogue, the `auth_http` request,
//!   the backend login and the relay. The client-side dialogues are in
//!   [`pop3`], [`imap`], [`smtp`], their SASL exchanges (`AUTH`,
//!   `AUTHENTICATE`) in [`sasl`]; [`auth_http`] builds the request and
//!   reads the answer; [`backend`] logs in to the backend server.
//!
//! # Session states
//!
//! ```text
//!  accepted ── PROXY header (listen ... proxy_protocol), realip
//!     │        TLS handshake (listen ... ssl)
//!     ▼ greeting (SMTP: after smtp_greeting_delay)
//!  auth state ── commands until the client names its credentials
//!     │          (STARTTLS/STLS: TLS handshake, then the dialogue again;
//!     │           max_errors invalid commands, timeout, too long ─▶ closed)
//!     ▼
//!  auth_http ── not OK: the error (after Auth-Wait) ─▶ auth state again,
//!     │                  or closed without Auth-Wait
//!     ▼ OK: Auth-Server, Auth-Port
//!  backend login (USER/PASS, LOGIN, EHLO/XCLIENT/AUTH) ── refused ─▶ closed
//!     ▼
//!  relay (proxy_timeout idle, either side's close ends it) ─▶ closed
//! ```
//!
//! Nothing a client, the auth server or a backend sends can panic the
//! worker: every parse returns an error that ends the session.

pub mod auth_http;
pub mod backend;
pub mod conf;
pub mod imap;
pub mod pop3;
pub mod sasl;
pub mod session;
pub mod smtp;

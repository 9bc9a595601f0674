//! Session resumption: `ssl_session_cache`, `ssl_session_timeout`,
//! `ssl_session_tickets`, `ssl_session_ticket_key`.
//!
//! - The cache: `builtin[:N]` is a cache of N sessions per server,
//!   `shared:NAME:SIZE` one cache per name for all servers and workers
//!   (about 4000 sessions per MiB, as nginx), kept across reloads while
//!   name and size stay; `none`/`off` keep no sessions.
//! - Every stored session and every ticket carries its expiry
//!   (`ssl_session_timeout` from when it was made): an older one is not
//!   resumed, as OpenSSL refuses an expired session. rustls itself only
//!   bounds tickets by its key rotation.
//! - Tickets: without `ssl_session_ticket_key`, one process-wide rotating
//!   key (rustls's), the same for every server and kept across reloads.
//!   With key files (nginx's 48- or 80-byte format: 16 bytes of name, then
//!   HMAC and AES secrets), the first file's key encrypts and all of them
//!   decrypt, so servers sharing the files resume each other's sessions,
//!   across restarts too. The ticket is tern's own: the key name, a random
//!   nonce and the session sealed with AES-GCM under the file's AES
//!   secret (AES-128 for 48-byte files, AES-256 for 80-byte ones); the
//!   HMAC secret is not needed with an AEAD. nginx's (OpenSSL's) tickets
//!   hold OpenSSL's session encoding, so tern and nginx do not resume each
//!   other's sessions even with the same key files.
//! - Each server's sessions and tickets carry its session id context
//!   ([`SidCtx`], as OpenSSL's `sid_ctx` that nginx derives from the
//!   server's certificates and client CA names): one made by a server
//!   with other certificates is not resumed (a full handshake follows),
//!   even through a shared cache or shared ticket keys.
//! - A TLS 1.2 session resumed from a ticket gets no new ticket (an empty
//!   NewSessionTicket, RFC 5077 3.3), as OpenSSL does unless the ticket's
//!   key is no longer the one that encrypts: rustls would send a fresh
//!   one, and an OpenSSL client drops the session it resumed when it
//!   gets one (and caches none), so its next connection is a full
//!   handshake. See [`client_hello`].

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::tls::provider;
use ring::aead;
use ring::rand::{SecureRandom, SystemRandom};
use rustls::server::{ProducesTickets, StoresServerSessions};

use crate::config::{ConfError, ConfResult};
use crate::core::errno_text;
use crate::http::modules::ssl_settings::SessionCache;

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A server's session id context: a digest of its certificates (their
/// names when they have variables) and of the CA names it sends.
pub type SidCtx = [u8; 32];

/// Prefixes a session with its expiry and its server's context.
fn stamp(secs: u64, ctx: &SidCtx, plain: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + 32 + plain.len());
    v.extend_from_slice(&now().saturating_add(secs).to_be_bytes());
    v.extend_from_slice(ctx);
    v.extend_from_slice(plain);
    v
}

/// The session behind its stamp, if it has not expired and was made by
/// a server with the same context.
fn unstamp(mut v: Vec<u8>, ctx: &SidCtx) -> Option<Vec<u8>> {
    let exp = u64::from_be_bytes(v.get(..8)?.try_into().ok()?);
    if exp < now() || v.get(8..40)? != ctx.as_slice() {
        return None;
    }
    v.drain(..40);
    Some(v)
}

/// Where this thread stands in the processing of a ClientHello.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hello {
    /// Not in one (QUIC, the stream module, the rest of a handshake).
    Outside,
    /// In [`client_hello`].
    Open,
    /// In it, and a ticket encrypted with the current key was decrypted.
    Resumed,
}

thread_local! {
    static HELLO: Cell<Hello> = const { Cell::new(Hello::Outside) };
}

/// Runs rustls's processing of a ClientHello (`into_connection`). A TLS
/// 1.2 session resumed there from a ticket is answered in the same call
/// (ServerHello, NewSessionTicket, Finished), so a ticket decrypted in it
/// and a ticket encrypted in it belong to the same connection: the new
/// ticket is left empty (no renewal, as OpenSSL). TLS 1.3 sends its
/// tickets later, after the client's Finished, outside this window.
pub fn client_hello<R>(f: impl FnOnce() -> R) -> R {
    HELLO.with(|h| h.set(Hello::Open));
    let r = f();
    HELLO.with(|h| h.set(Hello::Outside));
    r
}

/// `shared:NAME:SIZE` caches by name: like nginx's shared zones, kept
/// across reloads while the size is unchanged.
type SharedCaches = Mutex<HashMap<String, (u64, Arc<dyn StoresServerSessions>)>>;

fn shared_caches() -> &'static SharedCaches {
    static C: OnceLock<SharedCaches> = OnceLock::new();
    C.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The server's session cache, its entries stamped with `timeout` and
/// the server's context.
pub fn storage(
    c: Option<&SessionCache>,
    timeout: u64,
    ctx: SidCtx,
) -> Arc<dyn StoresServerSessions> {
    let inner: Arc<dyn StoresServerSessions> = match c {
        None | Some(SessionCache::None) | Some(SessionCache::Off) => {
            return Arc::new(rustls::server::NoServerSessionStorage {})
        }
        Some(SessionCache::Cache {
            shared: Some((name, size)),
            ..
        }) => {
            let mut m = shared_caches().lock().unwrap_or_else(|p| p.into_inner());
            match m.get(name) {
                Some((s, c)) if s == size => c.clone(),
                _ => {
                    // nginx: one megabyte stores about 4000 sessions.
                    let n = usize::try_from(size / 256).unwrap_or(usize::MAX).max(1);
                    let c: Arc<dyn StoresServerSessions> =
                        rustls::server::ServerSessionMemoryCache::new(n);
                    m.insert(name.clone(), (*size, c.clone()));
                    c
                }
            }
        }
        Some(SessionCache::Cache {
            builtin: Some(n),
            shared: None,
        }) => rustls::server::ServerSessionMemoryCache::new(*n),
        Some(SessionCache::Cache { .. }) => {
            return Arc::new(rustls::server::NoServerSessionStorage {})
        }
    };
    Arc::new(TimedCache {
        inner,
        secs: timeout,
        ctx,
    })
}

#[derive(Debug)]
struct TimedCache {
    inner: Arc<dyn StoresServerSessions>,
    secs: u64,
    ctx: SidCtx,
}

impl StoresServerSessions for TimedCache {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        self.inner.put(key, stamp(self.secs, &self.ctx, &value))
    }
    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.inner.get(key).and_then(|v| unstamp(v, &self.ctx))
    }
    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        // A session of another context stays for its own servers.
        let v = self.inner.get(key)?;
        unstamp(v, &self.ctx)?;
        self.inner.take(key).and_then(|v| unstamp(v, &self.ctx))
    }
    fn can_cache(&self) -> bool {
        self.inner.can_cache()
    }
}

/// The process's ticket keys (rotated by rustls), the same for every
/// server and kept across reloads.
fn process_ticketer() -> Option<Arc<dyn ProducesTickets>> {
    static T: OnceLock<Option<Arc<dyn ProducesTickets>>> = OnceLock::new();
    T.get_or_init(|| provider::Ticketer::new().ok()).clone()
}

/// The server's ticketer: its key files' or the process's, tickets
/// valid for `timeout` seconds on servers of the same context.
pub fn ticketer(
    key_files: Option<&[String]>,
    timeout: u64,
    ctx: SidCtx,
) -> ConfResult<Option<Arc<dyn ProducesTickets>>> {
    let inner = match key_files {
        Some(files) if !files.is_empty() => Keys::Files(KeyFiles::load(files)?),
        _ => match process_ticketer() {
            Some(t) => Keys::Process(t),
            None => return Ok(None),
        },
    };
    Ok(Some(Arc::new(Timed {
        inner,
        secs: timeout,
        ctx,
    })))
}

#[derive(Debug)]
enum Keys {
    Files(KeyFiles),
    /// rustls's rotating keys (a ticket of the previous key is not
    /// renewed either: nginx 1.22's OpenSSL keys never rotate).
    Process(Arc<dyn ProducesTickets>),
}

/// Tickets that expire `ssl_session_timeout` after they were made (the
/// lifetime hint says the same), for servers of one context.
#[derive(Debug)]
struct Timed {
    inner: Keys,
    secs: u64,
    ctx: SidCtx,
}

impl ProducesTickets for Timed {
    fn enabled(&self) -> bool {
        match &self.inner {
            Keys::Files(_) => true,
            Keys::Process(p) => p.enabled(),
        }
    }
    fn lifetime(&self) -> u32 {
        let inner = match &self.inner {
            Keys::Files(_) => u32::MAX,
            Keys::Process(p) => p.lifetime(),
        };
        u32::try_from(self.secs).unwrap_or(u32::MAX).min(inner)
    }
    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        if HELLO.with(|h| h.get()) == Hello::Resumed {
            // A TLS 1.2 resumption from a current ticket: no renewal.
            HELLO.with(|h| h.set(Hello::Open));
            return None;
        }
        let plain = stamp(self.secs, &self.ctx, plain);
        match &self.inner {
            Keys::Files(f) => f.encrypt(&plain),
            Keys::Process(p) => p.encrypt(&plain),
        }
    }
    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        let (plain, current) = match &self.inner {
            Keys::Files(f) => f.decrypt_with(cipher)?,
            Keys::Process(p) => (p.decrypt(cipher)?, true),
        };
        let plain = unstamp(plain, &self.ctx)?;
        if current {
            HELLO.with(|h| {
                if h.get() == Hello::Open {
                    h.set(Hello::Resumed)
                }
            });
        }
        Some(plain)
    }
}

/// One `ssl_session_ticket_key` file.
struct TicketKey {
    name: [u8; 16],
    key: aead::LessSafeKey,
}

/// Keys from files: the first encrypts, all decrypt.
struct KeyFiles {
    keys: Vec<TicketKey>,
    rng: SystemRandom,
}

impl std::fmt::Debug for KeyFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyFiles")
            .field("keys", &self.keys.len())
            .finish()
    }
}

impl KeyFiles {
    fn load(files: &[String]) -> ConfResult<KeyFiles> {
        let mut keys = Vec::with_capacity(files.len());
        for f in files {
            let b = std::fs::read(f).map_err(|e| {
                ConfError::new(format!("open() \"{}\" failed {}", f, errno_text(&e)))
            })?;
            let (alg, secret): (&'static aead::Algorithm, &[u8]) = match b.len() {
                48 => (&aead::AES_128_GCM, &b[32..48]),
                80 => (&aead::AES_256_GCM, &b[48..80]),
                _ => return Err(ConfError::new(format!("\"{}\" must be 48 or 80 bytes", f))),
            };
            let key = aead::UnboundKey::new(alg, secret)
                .map_err(|_| ConfError::new(format!("\"{}\": bad key", f)))?;
            let mut name = [0u8; 16];
            name.copy_from_slice(&b[..16]);
            keys.push(TicketKey {
                name,
                key: aead::LessSafeKey::new(key),
            });
        }
        Ok(KeyFiles {
            keys,
            rng: SystemRandom::new(),
        })
    }
}

impl ProducesTickets for KeyFiles {
    fn enabled(&self) -> bool {
        true
    }
    fn lifetime(&self) -> u32 {
        u32::MAX
    }
    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let k = self.keys.first()?;
        let mut nonce = [0u8; 12];
        self.rng.fill(&mut nonce).ok()?;
        let mut out = Vec::with_capacity(16 + 12 + plain.len() + 16);
        out.extend_from_slice(&k.name);
        out.extend_from_slice(&nonce);
        let mut body = plain.to_vec();
        k.key
            .seal_in_place_append_tag(
                aead::Nonce::assume_unique_for_key(nonce),
                aead::Aad::from(&k.name),
                &mut body,
            )
            .ok()?;
        out.extend_from_slice(&body);
        Some(out)
    }
    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        self.decrypt_with(cipher).map(|(p, _)| p)
    }
}

impl KeyFiles {
    /// The plaintext, and whether the first key (the one that encrypts)
    /// opened it.
    fn decrypt_with(&self, cipher: &[u8]) -> Option<(Vec<u8>, bool)> {
        if cipher.len() < 16 + 12 + 16 {
            return None;
        }
        let (name, rest) = cipher.split_at(16);
        let (nonce, sealed) = rest.split_at(12);
        let i = self.keys.iter().position(|k| k.name == name)?;
        let k = &self.keys[i];
        let nonce = aead::Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut body = sealed.to_vec();
        let plain = k
            .key
            .open_in_place(nonce, aead::Aad::from(&k.name), &mut body)
            .ok()?;
        Some((plain.to_vec(), i == 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_files_share_tickets() {
        let dir = std::env::temp_dir().join(format!("tern-tk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = dir.join("a.key");
        let b = dir.join("b.key");
        std::fs::write(&a, [1u8; 80]).unwrap();
        let mut k48 = [2u8; 48];
        k48[0] = 9;
        std::fs::write(&b, k48).unwrap();
        let a = a.to_string_lossy().into_owned();
        let b = b.to_string_lossy().into_owned();
        let one = KeyFiles::load(&[a.clone(), b.clone()]).unwrap();
        let two = KeyFiles::load(&[b.clone(), a.clone()]).unwrap();
        let t = one.encrypt(b"session").unwrap();
        assert_eq!(two.decrypt(&t).unwrap(), b"session");
        let only_b = KeyFiles::load(&[b]).unwrap();
        assert!(only_b.decrypt(&t).is_none());
        std::fs::write(dir.join("c.key"), [0u8; 10]).unwrap();
        assert!(KeyFiles::load(&[dir.join("c.key").to_string_lossy().into_owned()]).is_err());
        let timed = Timed {
            inner: Keys::Files(one),
            secs: 60,
            ctx: [1; 32],
        };
        let t = timed.encrypt(b"x").unwrap();
        assert_eq!(timed.decrypt(&t).unwrap(), b"x");
        // Another server's context does not resume it.
        let other = Timed {
            inner: Keys::Files(two),
            secs: 60,
            ctx: [2; 32],
        };
        assert!(other.decrypt(&t).is_none());
        // Decrypted in a ClientHello with the current key: the ticket
        // sent in the same ClientHello's processing is empty.
        let t2 = client_hello(|| {
            assert!(timed.decrypt(&t).is_some());
            timed.encrypt(b"y")
        });
        assert!(t2.is_none());
        assert!(timed.encrypt(b"y").is_some());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

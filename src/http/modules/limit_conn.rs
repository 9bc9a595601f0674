//! `limit_conn_zone`, `limit_conn*`: concurrent requests per key (access
//! phase), as nginx's ngx_http_limit_conn_module.
//!
//! A zone is ordinary shared Rust state ([`ConnState`]: a map key -> count
//! behind a mutex), reached from every worker thread through an `Arc`.
//! Zones live in a process-global [`registry`] keyed by name and size, so a
//! reload that keeps a zone's name and size keeps its counts (nginx reuses
//! the shared memory zone the same way).
//!
//! A slot is taken in the access phase and released by the guard pushed to
//! `cx.guards` when the request ends: after the log phase, or when the
//! connection task is dropped because the client vanished.
//!
//! Memory budget: nginx's zone is a slab allocator over `SIZE` bytes; when
//! it cannot allocate a node the request is rejected. [`SlabBudget`] models
//! that allocator's page and slot accounting so that a zone of a given size
//! holds about as many keys as nginx's does (shared with limit_req).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::config::registry::{arg, ctx, duplicate, flag, set_once, Args, Setter, Spec};
use crate::config::{value, ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::http::conf::{HttpMain, LocConf};
use crate::http::phases::{Ctx, Step};
use crate::http::response::Response;
use crate::http::vars::Template;

// ---------------------------------------------------------------------------
// Shared by limit_conn and limit_req: the slab model, the zone registry,
// and the directive helpers both modules use with the same wording.
// ---------------------------------------------------------------------------

/// nginx's page size on the platforms tern runs on.
const PAGE: usize = 4096;
/// Size classes of nginx's slab allocator: 8 bytes .. half a page.
const CLASSES: usize = 9;
/// Bytes of the slab pool header, slot descriptors and per-class stats at
/// the start of a zone (64-bit nginx: ~200 + 9 * 24 + 9 * 32).
const POOL_HEADER: usize = 704;
/// Bytes of nginx's page descriptor, one per page.
const PAGE_DESC: usize = 24;

/// An estimate of nginx's slab allocator over a zone of `size` bytes:
/// whole pages are handed to size classes (powers of two from 8 to 2048
/// bytes) or to allocations larger than half a page. A class takes a new
/// page when its pages are full and gives one back when a page's worth of
/// slots is free. Fragmentation inside pages is not modelled.
#[derive(Debug, Clone)]
pub struct SlabBudget {
    pages: usize,
    used: usize,
    live: [usize; CLASSES],
}

impl SlabBudget {
    /// The pages nginx's `ngx_slab_init` would make of `size` bytes.
    pub fn new(size: usize) -> SlabBudget {
        let avail = size.saturating_sub(POOL_HEADER);
        let mut pages = avail / (PAGE + PAGE_DESC);
        // The pages start at the first page boundary after the descriptors.
        let start = (POOL_HEADER + pages * PAGE_DESC).div_ceil(PAGE) * PAGE;
        pages = pages.min(size.saturating_sub(start) / PAGE);
        SlabBudget {
            pages,
            used: 0,
            live: [0; CLASSES],
        }
    }

    /// Slot size class of an allocation of `size` bytes (None: whole pages).
    fn class(size: usize) -> Option<usize> {
        if size > PAGE / 2 {
            return None;
        }
        let slot = size.max(8).next_power_of_two();
        Some(slot.trailing_zeros() as usize - 3)
    }

    /// Slots per page of a class: small classes keep their bitmap inside
    /// the page (losing slots to it), larger ones in the page descriptor.
    fn per_page(class: usize) -> usize {
        let slot = 8usize << class;
        let n = PAGE / slot;
        if slot < 64 {
            n - (n / 8).div_ceil(slot)
        } else {
            n
        }
    }

    /// Takes `size` bytes; false when the zone is out of memory.
    pub fn alloc(&mut self, size: usize) -> bool {
        match Self::class(size) {
            None => {
                let need = size.div_ceil(PAGE);
                if self.used + need > self.pages {
                    return false;
                }
                self.used += need;
                true
            }
            Some(c) => {
                if self.live[c].is_multiple_of(Self::per_page(c)) {
                    if self.used >= self.pages {
                        return false;
                    }
                    self.used += 1;
                }
                self.live[c] += 1;
                true
            }
        }
    }

    /// Gives back an allocation of `size` bytes.
    pub fn free(&mut self, size: usize) {
        match Self::class(size) {
            None => self.used = self.used.saturating_sub(size.div_ceil(PAGE)),
            Some(c) => {
                if self.live[c] == 0 {
                    return;
                }
                self.live[c] -= 1;
                if self.live[c].is_multiple_of(Self::per_page(c)) {
                    self.used = self.used.saturating_sub(1);
                }
            }
        }
    }
}

/// Which module a zone belongs to: nginx refuses one name for both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ZoneKind {
    Conn,
    Req,
}

/// State that outlives a configuration: what the registry shares.
pub trait ZoneState: Send + Sync + 'static {
    fn size(&self) -> usize;
    /// The key as written (`$binary_remote_addr`), for nginx's reload check.
    fn key_src(&self) -> &str;
}

type Entry = (ZoneKind, String, Weak<dyn std::any::Any + Send + Sync>);

/// The process-global zone registry: weak references, so a zone lives as
/// long as some configuration (or request) uses it. Several generations of
/// one name may be alive at once (a failed reload with a new size must not
/// make the running zone unreachable for the next reload).
fn registry() -> MutexGuard<'static, Vec<Entry>> {
    static REG: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
    REG.lock().unwrap_or_else(|e| e.into_inner())
}

/// The zone state for `name`: the live one of that kind, name and size if
/// any (a reload keeps its state), else a new one from `make`. A kept zone
/// whose key changed is an error, worded as nginx's.
pub fn zone_state<S: ZoneState>(
    kind: ZoneKind,
    name: &str,
    size: usize,
    key_src: &str,
    what: &str,
    d: &Directive,
    make: impl FnOnce() -> S,
) -> ConfResult<Arc<S>> {
    let mut reg = registry();
    reg.retain(|(_, _, w)| w.strong_count() > 0);
    for (k, n, w) in reg.iter() {
        if *k != kind || n != name {
            continue;
        }
        let Some(any) = w.upgrade() else { continue };
        let Ok(s) = any.downcast::<S>() else { continue };
        if s.size() != size {
            continue;
        }
        if s.key_src() != key_src {
            return Err(ConfError::at(
                format!(
                    "{} \"{}\" uses the \"{}\" key while previously it used the \"{}\" key",
                    what,
                    name,
                    key_src,
                    s.key_src()
                ),
                d,
            ));
        }
        return Ok(s);
    }
    let s = Arc::new(make());
    let any: Arc<dyn std::any::Any + Send + Sync> = s.clone();
    reg.push((kind, name.to_string(), Arc::downgrade(&any)));
    Ok(s)
}

/// Parses the `zone=NAME:SIZE` parameter of `*_zone` directives.
pub fn parse_zone_param(v: &str, d: &Directive) -> ConfResult<(String, usize)> {
    let rest = &v[5..];
    let bad = || ConfError::at(format!("invalid zone size \"{}\"", v), d);
    let (name, size) = rest.split_once(':').ok_or_else(bad)?;
    let size = value::size(size).ok_or_else(bad)? as usize;
    if size < 8 * PAGE {
        return Err(ConfError::at(format!("zone \"{}\" is too small", v), d));
    }
    Ok((name.to_string(), size))
}

/// nginx's "already declared for a different use" check across the two
/// modules' zones of this configuration.
pub fn check_other_use(hm: &HttpMain, kind: ZoneKind, name: &str, d: &Directive) -> ConfResult<()> {
    let other = match kind {
        ZoneKind::Conn => hm.modules.limit_req.zones.contains_key(name),
        ZoneKind::Req => hm.modules.limit_conn.zones.contains_key(name),
    };
    if other {
        return Err(ConfError::at(
            format!(
                "the shared memory zone \"{}\" is already declared for a different use",
                name
            ),
            d,
        ));
    }
    Ok(())
}

/// `*_status CODE`: a number in 400..599, nginx's wording.
pub fn set_status(slot: &mut Option<u16>, d: &Directive) -> ConfResult<()> {
    if slot.is_some() {
        return Err(duplicate(d));
    }
    let n = value::number(arg(d, 0))
        .ok_or_else(|| ConfError::at(format!("\"{}\" directive invalid number", d.name), d))?;
    if !(400..=599).contains(&n) {
        return Err(ConfError::at("value must be between 400 and 599", d));
    }
    *slot = Some(n as u16);
    Ok(())
}

/// `*_log_level info|notice|warn|error`.
pub fn set_level(slot: &mut Option<Level>, d: &Directive) -> ConfResult<()> {
    if slot.is_some() {
        return Err(duplicate(d));
    }
    let v = arg(d, 0);
    let l = match v {
        "info" => Level::Info,
        "notice" => Level::Notice,
        "warn" => Level::Warn,
        "error" => Level::Error,
        _ => return Err(ConfError::at(format!("invalid value \"{}\"", v), d)),
    };
    *slot = Some(l);
    Ok(())
}

/// A `*_dry_run on|off` flag.
pub fn set_flag(slot: &mut Option<bool>, d: &Directive) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(slot, v, d)
}

/// One `limit_conn` or `limit_req` line of a location: it names its zone.
pub trait ZoneLimit {
    fn zone(&self) -> &str;
}

/// The location-level configuration both modules have: their limits and
/// their `*_status`, `*_log_level` and `*_dry_run`.
#[derive(Debug, Clone)]
pub struct LimitLoc<L> {
    /// The limits of the innermost level that has any (not merged item by
    /// item: nginx inherits the whole list only when a level has none).
    pub limits: Option<Vec<L>>,
    pub status: Option<u16>,
    pub log_level: Option<Level>,
    pub dry_run: Option<bool>,
}

impl<L> Default for LimitLoc<L> {
    fn default() -> Self {
        LimitLoc {
            limits: None,
            status: None,
            log_level: None,
            dry_run: None,
        }
    }
}

impl<L: Clone + ZoneLimit> LimitLoc<L> {
    pub fn merge(&mut self, p: &LimitLoc<L>) {
        crate::http::conf::merge_opts!(self, p; limits, status, log_level, dry_run);
    }

    /// Adds a limit of this level; a second one on the same zone is
    /// nginx's "is duplicate".
    pub fn push(&mut self, l: L, d: &Directive) -> ConfResult<()> {
        let limits = self.limits.get_or_insert_with(Vec::new);
        if limits.iter().any(|x| x.zone() == l.zone()) {
            return Err(duplicate(d));
        }
        limits.push(l);
        Ok(())
    }

    /// A limit refused the request: counted, noted for `$*_status`, and
    /// answered with `*_status` (503 by default); in a dry run it goes on.
    pub fn reject(
        &self,
        cx: &mut Ctx<'_>,
        note: &'static str,
        rejected: &AtomicU64,
        rejected_dry_run: &AtomicU64,
    ) -> Step {
        if self.dry_run.unwrap_or(false) {
            bump(rejected_dry_run);
            cx.set_note(note, b"REJECTED_DRY_RUN");
            return Step::Next;
        }
        bump(rejected);
        cx.set_note(note, b"REJECTED");
        Step::done(Response::status(self.status.unwrap_or(503)))
    }
}

/// Counts a decision.
pub fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// nginx's error for a second `*_zone` of one name in a configuration.
pub fn already_bound(d: &Directive, name: &str, key_src: &str) -> ConfError {
    ConfError::at(
        format!(
            "{} \"{}\" is already bound to key \"{}\"",
            d.name, name, key_src
        ),
        d,
    )
}

/// nginx's error for a `limit_req_zone` or `limit_req` without `zone=`.
pub fn no_zone_param(d: &Directive) -> ConfError {
    ConfError::at(format!("\"{}\" must have \"zone\" parameter", d.name), d)
}

/// The key a zone gives this request; None when it does not limit it:
/// the key is empty, or longer than `max` bytes (logged as nginx does).
pub fn request_key(cx: &Ctx<'_>, key: &Template, key_src: &str, max: usize) -> Option<Vec<u8>> {
    let v = key.render_vec(cx);
    if v.is_empty() {
        return None;
    }
    if v.len() > max {
        cx.log(
            Level::Error,
            &format!(
                "the value of the \"{}\" key is more than {} bytes: \"{}\"",
                key_src,
                max,
                String::from_utf8_lossy(&v)
            ),
        );
        return None;
    }
    Some(v)
}

/// Checks that every zone a location uses was declared (nginx: "zero size
/// shared memory zone" at startup). For the engine to call on each
/// compiled location configuration once the http block is complete.
pub fn check_zones(hm: &HttpMain, loc: &LocConf) -> ConfResult<()> {
    let conns = loc
        .modules
        .limit_conn
        .limits
        .iter()
        .flatten()
        .map(|l| &l.zone);
    let reqs = loc
        .modules
        .limit_req
        .limits
        .iter()
        .flatten()
        .map(|l| &l.zone);
    for z in conns {
        if !hm.modules.limit_conn.zones.contains_key(z.as_str()) {
            return Err(zero_size(z));
        }
    }
    for z in reqs {
        if !hm.modules.limit_req.zones.contains_key(z.as_str()) {
            return Err(zero_size(z));
        }
    }
    Ok(())
}

fn zero_size(z: &str) -> ConfError {
    ConfError::new(format!("zero size shared memory zone \"{}\"", z))
}

/// Logs a zone used at request time that the configuration never declared
/// (only possible until the engine calls [`check_zones`]) and answers 500.
pub fn missing_zone(cx: &Ctx<'_>, z: &str) -> Step {
    cx.log(
        Level::Error,
        &format!("zero size shared memory zone \"{}\"", z),
    );
    Step::done(Response::status(500))
}

// ---------------------------------------------------------------------------
// limit_conn itself.
// ---------------------------------------------------------------------------

/// nginx's node size for a key: `offsetof(ngx_rbtree_node_t, color)` (32)
/// + `offsetof(ngx_http_limit_conn_node_t, data)` (4) + the key.
fn node_size(key_len: usize) -> usize {
    36 + key_len
}

/// Counters of one zone's decisions (for the metrics endpoint).
#[derive(Debug, Default)]
pub struct ConnCounters {
    pub passed: AtomicU64,
    pub rejected: AtomicU64,
    pub rejected_dry_run: AtomicU64,
}

#[derive(Debug)]
struct ConnInner {
    counts: HashMap<Box<[u8]>, u32>,
    slab: SlabBudget,
}

/// A limit_conn zone's shared state (kept across reloads).
#[derive(Debug)]
pub struct ConnState {
    size: usize,
    key_src: String,
    inner: Mutex<ConnInner>,
    pub counters: ConnCounters,
}

impl ZoneState for ConnState {
    fn size(&self) -> usize {
        self.size
    }
    fn key_src(&self) -> &str {
        &self.key_src
    }
}

/// What taking a slot can end in.
#[derive(Debug, PartialEq, Eq)]
pub enum Take {
    Ok,
    /// The key already has `limit` requests.
    Limited,
    /// No memory for a new key's node.
    NoMemory,
}

impl ConnState {
    pub fn new(size: usize, key_src: &str) -> ConnState {
        let mut slab = SlabBudget::new(size);
        // What nginx's zone init allocates: the rbtree (24), its sentinel
        // (40) and the log context string.
        slab.alloc(24);
        slab.alloc(40);
        slab.alloc(32);
        ConnState {
            size,
            key_src: key_src.to_string(),
            inner: Mutex::new(ConnInner {
                counts: HashMap::new(),
                slab,
            }),
            counters: ConnCounters::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ConnInner> {
        // A panic while holding the lock cannot leave the map inconsistent
        // (each update is one insert or remove), so poisoning is ignored.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes one slot for `key` if fewer than `limit` are taken.
    pub fn take(&self, key: &[u8], limit: u32) -> Take {
        let mut g = self.lock();
        let inner = &mut *g;
        if let Some(n) = inner.counts.get_mut(key) {
            if *n >= limit {
                return Take::Limited;
            }
            *n += 1;
            return Take::Ok;
        }
        if !inner.slab.alloc(node_size(key.len())) {
            return Take::NoMemory;
        }
        inner.counts.insert(key.into(), 1);
        Take::Ok
    }

    /// Gives a slot back; the key's node goes when its count reaches zero.
    pub fn release(&self, key: &[u8]) {
        let mut g = self.lock();
        let inner = &mut *g;
        if let Some(n) = inner.counts.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                inner.counts.remove(key);
                inner.slab.free(node_size(key.len()));
            }
        }
    }

    /// Slots taken now, all keys together.
    pub fn in_use(&self) -> u64 {
        self.lock().counts.values().map(|&n| n as u64).sum()
    }

    /// Keys with a node now.
    pub fn keys(&self) -> usize {
        self.lock().counts.len()
    }
}

/// One `limit_conn_zone` of the configuration.
#[derive(Debug)]
pub struct ConnZone {
    pub name: String,
    pub key: Template,
    pub state: Arc<ConnState>,
}

/// http-level state: the zones by name.
#[derive(Debug, Clone, Default)]
pub struct LimitConnMain {
    pub zones: HashMap<String, Arc<ConnZone>>,
}

/// One `limit_conn ZONE N`.
#[derive(Debug, Clone)]
pub struct ConnLimit {
    pub zone: String,
    pub n: u32,
}

impl ZoneLimit for ConnLimit {
    fn zone(&self) -> &str {
        &self.zone
    }
}

pub type LimitConnLoc = LimitLoc<ConnLimit>;

fn set_zone(hm: &mut HttpMain, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let key_src = arg(d, 0);
    let key = cx.template(key_src, d)?;
    let v = arg(d, 1);
    if !v.starts_with("zone=") {
        return Err(ConfError::at(format!("invalid parameter \"{}\"", v), d));
    }
    let (name, size) = parse_zone_param(v, d)?;
    if let Some(z) = hm.modules.limit_conn.zones.get(&name) {
        return Err(already_bound(d, &name, &z.state.key_src));
    }
    check_other_use(hm, ZoneKind::Conn, &name, d)?;
    let state = zone_state(
        ZoneKind::Conn,
        &name,
        size,
        key_src,
        "limit_conn_zone",
        d,
        || ConnState::new(size, key_src),
    )?;
    hm.modules
        .limit_conn
        .zones
        .insert(name.clone(), Arc::new(ConnZone { name, key, state }));
    Ok(())
}

fn set_limit(l: &mut LocConf, d: &Directive, _cx: &mut Compiler) -> ConfResult<()> {
    let zone = arg(d, 0).to_string();
    let nv = arg(d, 1);
    let n = match value::number(nv) {
        Some(n) if n > 0 => n,
        _ => {
            return Err(ConfError::at(
                format!("invalid number of connections \"{}\"", nv),
                d,
            ))
        }
    };
    if n > 65535 {
        return Err(ConfError::at("connection limit must be less 65536", d));
    }
    l.modules
        .limit_conn
        .push(ConnLimit { zone, n: n as u32 }, d)
}

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "limit_conn_zone",
        ctx: ctx::HTTP,
        args: Args::take(2),
        set: Setter::HttpMain(set_zone),
    },
    Spec {
        name: "limit_conn",
        ctx: ctx::HSL,
        args: Args::take(2),
        set: Setter::Loc(set_limit),
    },
    Spec {
        name: "limit_conn_status",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(|l, d, _| set_status(&mut l.modules.limit_conn.status, d)),
    },
    Spec {
        name: "limit_conn_log_level",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(|l, d, _| set_level(&mut l.modules.limit_conn.log_level, d)),
    },
    Spec {
        name: "limit_conn_dry_run",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(|l, d, _| set_flag(&mut l.modules.limit_conn.dry_run, d)),
    },
];

/// A slot held by a request; dropping it gives the slot back.
struct Slot {
    state: Arc<ConnState>,
    key: Box<[u8]>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.state.release(&self.key);
    }
}

const NOTE: &str = "limit_conn_status";

/// Access phase handler: takes one slot per `limit_conn` of the location,
/// once per request (an internal redirect does not count again).
pub fn access(cx: &mut Ctx<'_>) -> Step {
    if cx.loc.modules.limit_conn.limits.is_none() || cx.note(NOTE).is_some() {
        return Step::Next;
    }
    let loc = cx.loc.clone();
    let conf = &loc.modules.limit_conn;
    let limits = conf.limits.as_deref().unwrap_or(&[]);
    let dry_run = conf.dry_run.unwrap_or(false);
    // Slots taken by this call: released at once if a later limit rejects.
    let mut taken: Vec<Slot> = Vec::new();
    for l in limits {
        let Some(zone) = cx.http.main.modules.limit_conn.zones.get(&l.zone).cloned() else {
            return missing_zone(cx, &l.zone);
        };
        let Some(key) = request_key(cx, &zone.key, &zone.state.key_src, 255) else {
            continue;
        };
        cx.set_note(NOTE, b"PASSED");
        match zone.state.take(&key, l.n) {
            Take::Ok => taken.push(Slot {
                state: zone.state.clone(),
                key: key.into(),
            }),
            r => {
                if r == Take::Limited {
                    cx.log(
                        conf.log_level.unwrap_or(Level::Error),
                        &format!(
                            "limiting connections{} by zone \"{}\"",
                            if dry_run { ", dry run," } else { "" },
                            zone.name
                        ),
                    );
                } else {
                    // nginx's slab allocator logs this itself, on the
                    // cycle's log: no connection number, no request.
                    crate::elog!(
                        Crit,
                        "ngx_slab_alloc() failed: no memory in limit_conn_zone \"{}\"",
                        zone.name
                    );
                }
                drop(taken);
                let c = &zone.state.counters;
                return conf.reject(cx, NOTE, &c.rejected, &c.rejected_dry_run);
            }
        }
        bump(&zone.state.counters.passed);
    }
    for s in taken {
        cx.guards.push(Box::new(s));
    }
    Step::Next
}

/// Module variables (`$limit_conn_status`).
pub const VARS: &[&str] = &["limit_conn_status"];

pub fn var(cx: &Ctx<'_>, _i: u8, out: &mut Vec<u8>) -> bool {
    cx.note_var(NOTE, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slab_pages_match_nginx_layout() {
        // 32k: 7 pages after the header page; 1m: 254.
        assert_eq!(SlabBudget::new(32768).pages, 7);
        assert_eq!(SlabBudget::new(1 << 20).pages, 254);
    }

    #[test]
    fn slab_class_accounting() {
        assert_eq!(SlabBudget::per_page(0), 504);
        assert_eq!(SlabBudget::per_page(2), 127);
        assert_eq!(SlabBudget::per_page(3), 64);
        assert_eq!(SlabBudget::per_page(4), 32);
        let mut s = SlabBudget::new(32768);
        // 40-byte nodes: 64 per page, 7 pages.
        let mut n = 0;
        while s.alloc(40) {
            n += 1;
        }
        assert_eq!(n, 7 * 64);
        s.free(40);
        assert!(s.alloc(40));
        assert!(!s.alloc(3000));
    }

    #[test]
    fn take_and_release() {
        let z = ConnState::new(32768, "$k");
        assert_eq!(z.take(b"a", 2), Take::Ok);
        assert_eq!(z.take(b"a", 2), Take::Ok);
        assert_eq!(z.take(b"a", 2), Take::Limited);
        assert_eq!(z.take(b"b", 2), Take::Ok);
        assert_eq!(z.in_use(), 3);
        z.release(b"a");
        z.release(b"a");
        z.release(b"b");
        assert_eq!((z.in_use(), z.keys()), (0, 0));
    }

    #[test]
    fn zone_runs_out_of_memory() {
        // 3000-byte keys take a page each; 32k has 7 pages, 2 of them used
        // by the zone's own structures.
        let z = ConnState::new(32768, "$k");
        let mut ok = 0;
        for i in 0..20u8 {
            let key = vec![i; 3000];
            match z.take(&key, 1) {
                Take::Ok => ok += 1,
                Take::NoMemory => break,
                Take::Limited => unreachable!(),
            }
        }
        assert_eq!(ok, 5);
    }
}

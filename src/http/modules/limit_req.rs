//! `limit_req_zone`, `limit_req*`: request rate per key with nginx's leaky
//! bucket (access phase), as ngx_http_limit_req_module.
//!
//! Arithmetic, all integers as in nginx: a rate is kept in requests per
//! 1000 s (`rate=10r/s` -> 10000, `rate=30r/m` -> 500); a key's `excess` is
//! in thousandths of a request and drains by `rate * ms / 1000` per elapsed
//! millisecond; each request adds 1000. A request whose excess would
//! exceed `burst * 1000` is rejected; one whose excess exceeds `delay *
//! 1000` waits `(excess - delay) * 1000 / rate` ms (`nodelay`: never).
//!
//! With several `limit_req` in a location, all but the last only look
//! (their excess is checked, not stored) until the last one accepts; then
//! every one is charged and the longest delay wins, as nginx does.
//!
//! Zone state ([`ReqState`]: an LRU of key nodes behind a mutex, with a
//! memory budget shared with limit_conn's model) lives in the registry of
//! [`super::limit_conn`], so a reload with the same name and size keeps it.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use super::limit_conn::{
    already_bound, bump, check_other_use, missing_zone, no_zone_param, parse_zone_param,
    request_key, set_flag, set_level, set_status, zone_state, LimitLoc, SlabBudget, ZoneKind,
    ZoneLimit, ZoneState,
};
use crate::config::registry::{arg, ctx, Args, Setter, Spec};
use crate::config::{value, ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::http::conf::{HttpMain, LocConf};
use crate::http::phases::{Ctx, Step};
use crate::http::vars::Template;

/// Milliseconds on a process-wide monotonic clock (nginx's
/// `ngx_current_msec`); shared by all workers so that a key's `last`
/// means the same thing on every thread.
pub fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    // Start at one minute so that "long ago" arithmetic never underflows.
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64 + 60_000
}

/// nginx's node size: `offsetof(ngx_rbtree_node_t, color)` (32) +
/// `offsetof(ngx_http_limit_req_node_t, data)` (48) + the key.
fn node_size(key_len: usize) -> usize {
    80 + key_len
}

/// The `nodelay` delay: nginx's NGX_MAX_INT_T_VALUE / 1000 requests.
const NODELAY: u64 = (i64::MAX as u64) / 1000;

/// One key's bucket.
#[derive(Debug, Clone)]
struct Node {
    key: Box<[u8]>,
    last: u64,
    excess: u64,
    /// LRU links (indices into `nodes`); head is the most recent.
    prev: usize,
    next: usize,
}

const NIL: usize = usize::MAX;

/// Counters of one zone's decisions (for the metrics endpoint).
#[derive(Debug, Default)]
pub struct ReqCounters {
    pub passed: AtomicU64,
    pub delayed: AtomicU64,
    pub rejected: AtomicU64,
    pub delayed_dry_run: AtomicU64,
    pub rejected_dry_run: AtomicU64,
}

#[derive(Debug)]
struct ReqInner {
    index: HashMap<Box<[u8]>, usize>,
    nodes: Vec<Node>,
    free: Vec<usize>,
    head: usize,
    tail: usize,
    slab: SlabBudget,
}

/// A limit_req zone's shared state (kept across reloads).
#[derive(Debug)]
pub struct ReqState {
    size: usize,
    key_src: String,
    inner: Mutex<ReqInner>,
    pub counters: ReqCounters,
}

impl ZoneState for ReqState {
    fn size(&self) -> usize {
        self.size
    }
    fn key_src(&self) -> &str {
        &self.key_src
    }
}

/// What a lookup decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// Within the burst; the excess (thousandths) this request brings.
    Ok(u64),
    /// Over the burst: the excess it would have had.
    Busy(u64),
    /// No memory for a new key even after evicting the oldest.
    NoMemory,
}

impl ReqInner {
    fn unlink(&mut self, i: usize) {
        let (p, n) = (self.nodes[i].prev, self.nodes[i].next);
        match p {
            NIL => self.head = n,
            p => self.nodes[p].next = n,
        }
        match n {
            NIL => self.tail = p,
            n => self.nodes[n].prev = p,
        }
    }

    fn push_front(&mut self, i: usize) {
        self.nodes[i].prev = NIL;
        self.nodes[i].next = self.head;
        if self.head != NIL {
            self.nodes[self.head].prev = i;
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
        }
    }

    fn remove(&mut self, i: usize) {
        self.unlink(i);
        let key = std::mem::take(&mut self.nodes[i].key);
        self.slab.free(node_size(key.len()));
        self.index.remove(&key);
        self.free.push(i);
    }

    /// nginx's `ngx_http_limit_req_expire`: `force` drops the least
    /// recently used node unconditionally; then up to two more are dropped
    /// if idle for a minute and fully drained.
    fn expire(&mut self, rate: u64, now: u64, force: bool) {
        let mut n = if force { 0 } else { 1 };
        while n < 3 {
            let i = self.tail;
            if i == NIL {
                return;
            }
            if n != 0 {
                let node = &self.nodes[i];
                let ms = now.abs_diff(node.last);
                if ms < 60_000 {
                    return;
                }
                if node.excess as i128 - (rate as i128 * ms as i128 / 1000) > 0 {
                    return;
                }
            }
            n += 1;
            self.remove(i);
        }
    }
}

/// nginx's drain: the excess after `ms` elapsed plus this request.
fn drained(excess: u64, rate: u64, now: u64, last: u64) -> (u64, u64) {
    // A clock step back of over a minute counts as 1 ms, a small one as 0.
    let ms: i64 = now as i64 - last as i64;
    let ms = if ms < -60_000 {
        1
    } else if ms < 0 {
        0
    } else {
        ms
    } as u64;
    let e = excess as i128 - (rate as i128 * ms as i128 / 1000) + 1000;
    (e.max(0) as u64, ms)
}

impl ReqState {
    pub fn new(size: usize, key_src: &str) -> ReqState {
        let mut slab = SlabBudget::new(size);
        // nginx's zone init: the shared context (80) and the log context.
        slab.alloc(80);
        slab.alloc(32);
        ReqState {
            size,
            key_src: key_src.to_string(),
            inner: Mutex::new(ReqInner {
                index: HashMap::new(),
                nodes: Vec::new(),
                free: Vec::new(),
                head: NIL,
                tail: NIL,
                slab,
            }),
            counters: ReqCounters::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ReqInner> {
        // Every update leaves the structure consistent before it can
        // panic (no user code runs under the lock), so poisoning is ignored.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// nginx's `ngx_http_limit_req_lookup`. `account`: store the new excess
    /// (the last limit of a location); otherwise only check it.
    pub fn lookup(&self, key: &[u8], rate: u64, burst: u64, account: bool, now: u64) -> Lookup {
        let mut g = self.lock();
        let inner = &mut *g;
        if let Some(&i) = inner.index.get(key) {
            inner.unlink(i);
            inner.push_front(i);
            let node = &mut inner.nodes[i];
            let (excess, ms) = drained(node.excess, rate, now, node.last);
            if excess > burst {
                return Lookup::Busy(excess);
            }
            if account {
                node.excess = excess;
                if ms != 0 {
                    node.last = now;
                }
            }
            return Lookup::Ok(excess);
        }
        let size = node_size(key.len());
        inner.expire(rate, now, false);
        if !inner.slab.alloc(size) {
            inner.expire(rate, now, true);
            if !inner.slab.alloc(size) {
                return Lookup::NoMemory;
            }
        }
        let node = Node {
            key: key.into(),
            last: now,
            excess: 0,
            prev: NIL,
            next: NIL,
        };
        let i = match inner.free.pop() {
            Some(i) => {
                inner.nodes[i] = node;
                i
            }
            None => {
                inner.nodes.push(node);
                inner.nodes.len() - 1
            }
        };
        inner.index.insert(key.into(), i);
        inner.push_front(i);
        Lookup::Ok(0)
    }

    /// nginx's `ngx_http_limit_req_account` for one non-last limit: charge
    /// the request now; returns the stored excess.
    pub fn charge(&self, key: &[u8], rate: u64, now: u64) -> Option<u64> {
        let mut g = self.lock();
        let i = *g.index.get(key)?;
        let node = &mut g.nodes[i];
        let (excess, ms) = drained(node.excess, rate, now, node.last);
        if ms != 0 {
            node.last = now;
        }
        node.excess = excess;
        Some(excess)
    }

    /// Keys with a node now.
    pub fn keys(&self) -> usize {
        self.lock().index.len()
    }
}

/// One `limit_req_zone` of the configuration.
#[derive(Debug)]
pub struct ReqZone {
    pub name: String,
    pub key: Template,
    /// Requests per 1000 seconds.
    pub rate: u64,
    pub state: Arc<ReqState>,
}

/// http-level state: the zones by name.
#[derive(Debug, Clone, Default)]
pub struct LimitReqMain {
    pub zones: HashMap<String, Arc<ReqZone>>,
}

/// One `limit_req zone=NAME [burst=N] [nodelay | delay=N]`.
#[derive(Debug, Clone)]
pub struct ReqLimit {
    pub zone: String,
    /// Thousandths of a request.
    pub burst: u64,
    /// Thousandths of a request.
    pub delay: u64,
}

impl ZoneLimit for ReqLimit {
    fn zone(&self) -> &str {
        &self.zone
    }
}

pub type LimitReqLoc = LimitLoc<ReqLimit>;

fn set_zone(hm: &mut HttpMain, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let key_src = arg(d, 0);
    let key = cx.template(key_src, d)?;
    let mut zone: Option<(String, usize)> = None;
    let mut rate: u64 = 1;
    let mut scale: u64 = 1;
    for a in d.args.iter().skip(1) {
        let v = a.value.as_str();
        if v.starts_with("zone=") {
            zone = Some(parse_zone_param(v, d)?);
            continue;
        }
        if let Some(r) = v.strip_prefix("rate=") {
            let (num, s) = if let Some(n) = r.strip_suffix("r/s") {
                (n, 1)
            } else if let Some(n) = r.strip_suffix("r/m") {
                (n, 60)
            } else {
                (r, 1)
            };
            rate = match value::number(num) {
                Some(n) if n > 0 => n,
                _ => return Err(ConfError::at(format!("invalid rate \"{}\"", v), d)),
            };
            scale = s;
            continue;
        }
        return Err(ConfError::at(format!("invalid parameter \"{}\"", v), d));
    }
    let Some((name, size)) = zone else {
        return Err(no_zone_param(d));
    };
    if let Some(z) = hm.modules.limit_req.zones.get(&name) {
        return Err(already_bound(d, &name, z.state.key_src()));
    }
    check_other_use(hm, ZoneKind::Req, &name, d)?;
    let state = zone_state(ZoneKind::Req, &name, size, key_src, "limit_req", d, || {
        ReqState::new(size, key_src)
    })?;
    let rate = rate.saturating_mul(1000) / scale;
    hm.modules.limit_req.zones.insert(
        name.clone(),
        Arc::new(ReqZone {
            name,
            key,
            rate,
            state,
        }),
    );
    Ok(())
}

fn set_limit(l: &mut LocConf, d: &Directive, _cx: &mut Compiler) -> ConfResult<()> {
    let mut zone: Option<String> = None;
    let mut burst = 0u64;
    let mut delay = 0u64;
    for a in &d.args {
        let v = a.value.as_str();
        if let Some(z) = v.strip_prefix("zone=") {
            zone = Some(z.to_string());
        } else if let Some(b) = v.strip_prefix("burst=") {
            burst = match value::number(b) {
                Some(n) if n > 0 => n,
                _ => return Err(ConfError::at(format!("invalid burst value \"{}\"", v), d)),
            };
        } else if let Some(b) = v.strip_prefix("delay=") {
            delay = match value::number(b) {
                Some(n) if n > 0 => n,
                _ => return Err(ConfError::at(format!("invalid delay value \"{}\"", v), d)),
            };
        } else if v == "nodelay" {
            delay = NODELAY;
        } else {
            return Err(ConfError::at(format!("invalid parameter \"{}\"", v), d));
        }
    }
    let Some(zone) = zone else {
        return Err(no_zone_param(d));
    };
    let limit = ReqLimit {
        zone,
        burst: burst * 1000,
        delay: delay.saturating_mul(1000),
    };
    l.modules.limit_req.push(limit, d)
}

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "limit_req_zone",
        ctx: ctx::HTTP,
        args: Args::take(3),
        set: Setter::HttpMain(set_zone),
    },
    Spec {
        name: "limit_req",
        ctx: ctx::HSL,
        args: Args::take123(),
        set: Setter::Loc(set_limit),
    },
    Spec {
        name: "limit_req_status",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(|l, d, _| set_status(&mut l.modules.limit_req.status, d)),
    },
    Spec {
        name: "limit_req_log_level",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(|l, d, _| set_level(&mut l.modules.limit_req.log_level, d)),
    },
    Spec {
        name: "limit_req_dry_run",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(|l, d, _| set_flag(&mut l.modules.limit_req.dry_run, d)),
    },
];

const NOTE: &str = "limit_req_status";
/// The delay decided for this request, in ms (see [`delay_of`]).
const DELAY_NOTE: &str = "limit_req_delay";

/// The delay limit_req decided for the request, if any: the engine sleeps
/// this long (on a timer, not blocking the loop) before the next access
/// handler. See the module docs of `phases` for the hook.
pub fn delay_of(cx: &Ctx<'_>) -> Option<Duration> {
    let v = cx.note(DELAY_NOTE)?;
    let ms: [u8; 8] = v.try_into().ok()?;
    Some(Duration::from_millis(u64::from_le_bytes(ms)))
}

/// The excess as nginx prints it: `1.000`.
fn excess_text(e: u64) -> String {
    format!("{}.{:03}", e / 1000, e % 1000)
}

/// Access phase handler: nginx's `ngx_http_limit_req_handler`, once per
/// request (an internal redirect does not count again).
pub fn access(cx: &mut Ctx<'_>) -> Step {
    if cx.loc.modules.limit_req.limits.is_none() || cx.note(NOTE).is_some() {
        return Step::Next;
    }
    let loc = cx.loc.clone();
    let conf = &loc.modules.limit_req;
    let limits = conf.limits.as_deref().unwrap_or(&[]);
    let dry_run = conf.dry_run.unwrap_or(false);
    let now = now_ms();
    // Limits that only looked (not the last), to charge once all agree.
    let mut looked: Vec<(usize, Arc<ReqZone>, Vec<u8>)> = Vec::new();
    let mut last: Option<(usize, Arc<ReqZone>, Lookup)> = None;
    for (i, l) in limits.iter().enumerate() {
        let Some(zone) = cx.http.main.modules.limit_req.zones.get(&l.zone).cloned() else {
            return missing_zone(cx, &l.zone);
        };
        let Some(key) = request_key(cx, &zone.key, zone.state.key_src(), 65535) else {
            continue;
        };
        let account = i + 1 == limits.len();
        let r = zone.state.lookup(&key, zone.rate, l.burst, account, now);
        match r {
            Lookup::Ok(_) if !account => looked.push((i, zone, key)),
            _ => {
                last = Some((i, zone, r));
                break;
            }
        }
    }
    let level = conf.log_level.unwrap_or(Level::Error);
    let dry = if dry_run { ", dry run" } else { "" };
    // The limit that decides: the one that stopped the loop, else (every
    // remaining key empty) nothing was charged yet.
    let (mut excess, mut by) = match &last {
        Some((_, zone, Lookup::Busy(e))) => {
            cx.log(
                level,
                &format!(
                    "limiting requests{}, excess: {} by zone \"{}\"",
                    dry,
                    excess_text(*e),
                    zone.name
                ),
            );
            let c = &zone.state.counters;
            return conf.reject(cx, NOTE, &c.rejected, &c.rejected_dry_run);
        }
        Some((_, zone, Lookup::NoMemory)) => {
            cx.log(
                Level::Alert,
                &format!(
                    "could not allocate node in limit_req zone \"{}\"",
                    zone.name
                ),
            );
            let c = &zone.state.counters;
            return conf.reject(cx, NOTE, &c.rejected, &c.rejected_dry_run);
        }
        Some((i, zone, Lookup::Ok(e))) => (*e, Some((*i, zone.clone()))),
        None if looked.is_empty() => return Step::Next,
        None => (0, None),
    };
    // nginx's account step: charge the limits that only looked; the
    // largest delay over all of them wins.
    let delay_of_limit = |e: u64, i: usize, rate: u64| -> u64 {
        let d = limits.get(i).map_or(NODELAY, |l| l.delay);
        if e <= d || rate == 0 {
            0
        } else {
            (e - d) * 1000 / rate
        }
    };
    let mut max_delay = by
        .as_ref()
        .map_or(0, |(i, z)| delay_of_limit(excess, *i, z.rate));
    for (i, zone, key) in looked.iter().rev() {
        let Some(e) = zone.state.charge(key, zone.rate, now) else {
            continue;
        };
        let d = delay_of_limit(e, *i, zone.rate);
        if d > max_delay {
            max_delay = d;
            excess = e;
            by = Some((*i, zone.clone()));
        }
    }
    let Some((_, zone)) = by else {
        cx.set_note(NOTE, b"PASSED");
        return Step::Next;
    };
    if max_delay == 0 {
        bump(&zone.state.counters.passed);
        cx.set_note(NOTE, b"PASSED");
        return Step::Next;
    }
    // nginx logs delays one level below the limit level.
    let delay_level = match level {
        Level::Error => Level::Warn,
        Level::Warn => Level::Notice,
        Level::Notice => Level::Info,
        _ => Level::Debug,
    };
    cx.log(
        delay_level,
        &format!(
            "delaying request{}, excess: {}, by zone \"{}\"",
            dry,
            excess_text(excess),
            zone.name
        ),
    );
    if dry_run {
        bump(&zone.state.counters.delayed_dry_run);
        cx.set_note(NOTE, b"DELAYED_DRY_RUN");
        return Step::Next;
    }
    bump(&zone.state.counters.delayed);
    cx.set_note(NOTE, b"DELAYED");
    cx.set_note(DELAY_NOTE, max_delay.to_le_bytes());
    delay_step(Duration::from_millis(max_delay))
}

/// What the handler returns for a delayed request: the engine must wait
/// `d` before the next access handler (see the report for the `Step`
/// variant this needs); until it can, the request goes on at once and the
/// delay is readable with [`delay_of`].
fn delay_step(d: Duration) -> Step {
    Step::Delay(d)
}

/// Module variables (`$limit_req_status`).
pub const VARS: &[&str] = &["limit_req_status"];

pub fn var(cx: &Ctx<'_>, _i: u8, out: &mut Vec<u8>) -> bool {
    cx.note_var(NOTE, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATE: u64 = 10_000; // 10r/s

    #[test]
    fn burst_then_reject_then_drain() {
        let z = ReqState::new(1 << 20, "$k");
        let t = 1_000_000;
        // burst=2: 1 + 2 pass at the same millisecond, the 4th is over.
        assert_eq!(z.lookup(b"a", RATE, 2000, true, t), Lookup::Ok(0));
        assert_eq!(z.lookup(b"a", RATE, 2000, true, t), Lookup::Ok(1000));
        assert_eq!(z.lookup(b"a", RATE, 2000, true, t), Lookup::Ok(2000));
        assert_eq!(z.lookup(b"a", RATE, 2000, true, t), Lookup::Busy(3000));
        // 100 ms drain one request at 10r/s.
        assert_eq!(z.lookup(b"a", RATE, 2000, true, t + 100), Lookup::Ok(2000));
        // 30 r/m = 500 per 1000 s: 1999 ms leave a thousandth, 2 s drain one.
        assert_eq!(z.lookup(b"b", 500, 0, true, t), Lookup::Ok(0));
        assert_eq!(z.lookup(b"b", 500, 0, true, t + 1999), Lookup::Busy(1));
        assert_eq!(z.lookup(b"b", 500, 0, true, t + 2000), Lookup::Ok(0));
    }

    #[test]
    fn look_only_does_not_store() {
        let z = ReqState::new(1 << 20, "$k");
        let t = 5_000_000;
        assert_eq!(z.lookup(b"a", RATE, 5000, true, t), Lookup::Ok(0));
        assert_eq!(z.lookup(b"a", RATE, 5000, false, t), Lookup::Ok(1000));
        assert_eq!(z.lookup(b"a", RATE, 5000, false, t), Lookup::Ok(1000));
        assert_eq!(z.charge(b"a", RATE, t), Some(1000));
        assert_eq!(z.lookup(b"a", RATE, 5000, false, t), Lookup::Ok(2000));
    }

    #[test]
    fn full_zone_evicts_oldest() {
        // 32k: 7 pages, one used by the 128-byte class with the context.
        let z = ReqState::new(32768, "$k");
        let t = 1_000_000;
        for i in 0..200u32 {
            let key = i.to_le_bytes();
            assert!(matches!(z.lookup(&key, RATE, 0, true, t), Lookup::Ok(_)));
        }
        assert!(z.keys() < 200, "{}", z.keys());
        // The first keys were evicted to make room.
        assert_eq!(
            z.lookup(&0u32.to_le_bytes(), RATE, 0, true, t),
            Lookup::Ok(0)
        );
        // A key bigger than the zone can never fit.
        assert_eq!(z.lookup(&[1u8; 40000], RATE, 0, true, t), Lookup::NoMemory);
    }

    #[test]
    fn expire_keeps_recent_nodes() {
        let z = ReqState::new(1 << 20, "$k");
        z.lookup(b"a", RATE, 0, true, 1_000_000);
        // A new key a second later does not expire "a" (idle < 60 s) ...
        z.lookup(b"b", RATE, 0, true, 1_001_000);
        assert_eq!(z.keys(), 2);
        // ... two minutes later both idle ones go.
        z.lookup(b"c", RATE, 0, true, 1_121_000);
        assert_eq!(z.keys(), 1);
    }
}

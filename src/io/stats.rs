//! Counters of the I/O layer's decisions, process-wide, lock-free
//! (`Relaxed` atomics: they are statistics, not synchronisation).
//! [`IoStats::snapshot`] copies them for a metrics endpoint.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// The global counters.
#[derive(Debug, Default)]
pub struct IoStats {
    pub reads_inline: AtomicU64,
    pub reads_offloaded: AtomicU64,
    pub reads_direct: AtomicU64,
    pub reads_uring: AtomicU64,
    pub sends_inline: AtomicU64,
    pub sends_warmed: AtomicU64,
    pub cachestat_calls: AtomicU64,
    pub cachestat_fallbacks: AtomicU64,
    /// Residency answered by the page tables of a mapping (no copy), see `resident.rs`.
    pub residency_mapped: AtomicU64,
    /// Sends of a whole file found resident a moment ago: no check at all.
    pub residency_memo: AtomicU64,
    pub opens_inline: AtomicU64,
    pub opens_offloaded: AtomicU64,
    /// Opens answered by a kept descriptor after a `stat` (see `reuse.rs`).
    pub opens_reused: AtomicU64,
    pub stats_inline: AtomicU64,
    pub stats_offloaded: AtomicU64,
    pub writes_inline: AtomicU64,
    pub writes_offloaded: AtomicU64,
    pub uring_submissions: AtomicU64,
    pub uring_fallbacks: AtomicU64,
    pub overflows: AtomicU64,
}

/// The one instance.
pub static STATS: IoStats = IoStats {
    reads_inline: AtomicU64::new(0),
    reads_offloaded: AtomicU64::new(0),
    reads_direct: AtomicU64::new(0),
    reads_uring: AtomicU64::new(0),
    sends_inline: AtomicU64::new(0),
    sends_warmed: AtomicU64::new(0),
    cachestat_calls: AtomicU64::new(0),
    cachestat_fallbacks: AtomicU64::new(0),
    residency_mapped: AtomicU64::new(0),
    residency_memo: AtomicU64::new(0),
    opens_inline: AtomicU64::new(0),
    opens_offloaded: AtomicU64::new(0),
    opens_reused: AtomicU64::new(0),
    stats_inline: AtomicU64::new(0),
    stats_offloaded: AtomicU64::new(0),
    writes_inline: AtomicU64::new(0),
    writes_offloaded: AtomicU64::new(0),
    uring_submissions: AtomicU64::new(0),
    uring_fallbacks: AtomicU64::new(0),
    overflows: AtomicU64::new(0),
};

pub(crate) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// A copy of [`IoStats`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoStatsSnapshot {
    pub reads_inline: u64,
    pub reads_offloaded: u64,
    pub reads_direct: u64,
    pub reads_uring: u64,
    pub sends_inline: u64,
    pub sends_warmed: u64,
    pub cachestat_calls: u64,
    pub cachestat_fallbacks: u64,
    pub residency_mapped: u64,
    pub residency_memo: u64,
    pub opens_inline: u64,
    pub opens_offloaded: u64,
    pub opens_reused: u64,
    pub stats_inline: u64,
    pub stats_offloaded: u64,
    pub writes_inline: u64,
    pub writes_offloaded: u64,
    pub uring_submissions: u64,
    pub uring_fallbacks: u64,
    pub overflows: u64,
}

impl IoStats {
    pub fn snapshot(&self) -> IoStatsSnapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        IoStatsSnapshot {
            reads_inline: g(&self.reads_inline),
            reads_offloaded: g(&self.reads_offloaded),
            reads_direct: g(&self.reads_direct),
            reads_uring: g(&self.reads_uring),
            sends_inline: g(&self.sends_inline),
            sends_warmed: g(&self.sends_warmed),
            cachestat_calls: g(&self.cachestat_calls),
            cachestat_fallbacks: g(&self.cachestat_fallbacks),
            residency_mapped: g(&self.residency_mapped),
            residency_memo: g(&self.residency_memo),
            opens_inline: g(&self.opens_inline),
            opens_offloaded: g(&self.opens_offloaded),
            opens_reused: g(&self.opens_reused),
            stats_inline: g(&self.stats_inline),
            stats_offloaded: g(&self.stats_offloaded),
            writes_inline: g(&self.writes_inline),
            writes_offloaded: g(&self.writes_offloaded),
            uring_submissions: g(&self.uring_submissions),
            uring_fallbacks: g(&self.uring_fallbacks),
            overflows: g(&self.overflows),
        }
    }
}

/// Per-pool counters, see [`ThreadPool::stats`](super::ThreadPool::stats).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolStats {
    pub name: String,
    pub threads: usize,
    pub max_queue: usize,
    /// Tasks queued and not yet picked up by a thread, now.
    pub queued: usize,
    /// Highest `queued` seen.
    pub max_queued: usize,
    pub overflows: u64,
    pub done: u64,
}

/// What one operation (or one request, since decisions accumulate) did,
/// for a `$tern_io` variable. Ordered: a later, "heavier" decision wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
#[repr(u8)]
pub enum Decision {
    /// Nothing was done yet.
    #[default]
    None = 0,
    /// Served on the event loop (data was resident, or `aio off`).
    Inline = 1,
    /// Submitted to io_uring.
    Uring = 2,
    /// Handed to a thread pool (cold data, directio, cold open).
    Offload = 3,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::None => "",
            Decision::Inline => "inline",
            Decision::Uring => "uring",
            Decision::Offload => "offload",
        }
    }
    fn from_u8(v: u8) -> Decision {
        match v {
            1 => Decision::Inline,
            2 => Decision::Uring,
            3 => Decision::Offload,
            _ => Decision::None,
        }
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A decision slot that keeps the heaviest decision recorded into it.
#[derive(Debug, Default)]
pub struct DecisionCell(AtomicU8);

impl DecisionCell {
    pub fn get(&self) -> Decision {
        Decision::from_u8(self.0.load(Ordering::Relaxed))
    }
    pub fn record(&self, d: Decision) {
        self.0.fetch_max(d as u8, Ordering::Relaxed);
    }
    pub fn reset(&self) {
        self.0.store(0, Ordering::Relaxed);
    }
}

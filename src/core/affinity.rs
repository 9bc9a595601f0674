//! `worker_cpu_affinity`: binds each worker thread to CPUs, as nginx binds
//! each worker process.
//!
//! The directive is parsed into [`CpuAffinity`] (kept in `MainConf`);
//! each worker thread calls [`bind_worker`] before it builds its event
//! loop, so the loop, its timers and the connections it serves stay on
//! those CPUs. Thread-pool threads are shared by all workers here, so
//! they are not bound (nginx's pools are per worker process and inherit
//! its mask).
//!
//! Masks are nginx's: a string of `0`/`1`, the rightmost character
//! standing for CPU 0; worker N takes mask N, or the last mask when there
//! are fewer masks than workers. `auto [mask]` gives worker N the N-th CPU
//! of the mask (all CPUs by default), wrapping around.

use crate::config::registry::{arg, invalid_args};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::{Compiler, MainConf};

/// nginx's limit (`CPU_SETSIZE`).
const MAX_CPUS: usize = 1024;

/// A parsed `worker_cpu_affinity`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CpuAffinity {
    /// One CPU per worker, taken in turn from these.
    Auto(Vec<usize>),
    /// The CPUs of each mask, in the order written.
    Masks(Vec<Vec<usize>>),
}

impl CpuAffinity {
    /// The CPUs worker `n` is bound to.
    pub fn cpus_of(&self, n: usize) -> Vec<usize> {
        match self {
            CpuAffinity::Auto(cpus) if cpus.is_empty() => Vec::new(),
            CpuAffinity::Auto(cpus) => vec![cpus[n % cpus.len()]],
            CpuAffinity::Masks(masks) => masks
                .get(n)
                .or_else(|| masks.last())
                .cloned()
                .unwrap_or_default(),
        }
    }

    /// nginx's warning when masks and workers do not pair up.
    pub fn mismatch_warning(&self, workers: usize) -> Option<&'static str> {
        match self {
            CpuAffinity::Masks(m) if m.len() != 1 && m.len() != workers => Some(
                "the number of \"worker_processes\" is not equal to the number of \
                 \"worker_cpu_affinity\" masks, using last mask for remaining worker processes",
            ),
            _ => None,
        }
    }
}

/// The CPUs a mask names (rightmost character = CPU 0).
fn parse_mask(d: &Directive, s: &str) -> ConfResult<Vec<usize>> {
    if s.len() > MAX_CPUS {
        return Err(ConfError::at(
            "\"worker_cpu_affinity\" supports up to 1024 CPUs only",
            d,
        ));
    }
    let mut cpus = Vec::new();
    for (cpu, c) in s.bytes().rev().enumerate() {
        match c {
            b'1' => cpus.push(cpu),
            b'0' => {}
            _ => {
                return Err(ConfError::at(
                    format!(
                        "invalid character \"{}\" in \"worker_cpu_affinity\"",
                        c as char
                    ),
                    d,
                ))
            }
        }
    }
    Ok(cpus)
}

pub fn set_worker_cpu_affinity(
    m: &mut MainConf,
    d: &Directive,
    _: &mut Compiler,
) -> ConfResult<()> {
    if m.cpu_affinity.is_some() {
        return Err(crate::config::registry::duplicate(d));
    }
    let v = if arg(d, 0) == "auto" {
        let cpus = match d.args.len() {
            1 => (0..MAX_CPUS).collect(),
            2 => parse_mask(d, arg(d, 1))?,
            _ => return Err(invalid_args(d)),
        };
        CpuAffinity::Auto(cpus)
    } else {
        CpuAffinity::Masks(
            d.args
                .iter()
                .map(|a| parse_mask(d, &a.value))
                .collect::<ConfResult<_>>()?,
        )
    };
    m.cpu_affinity = Some(v);
    Ok(())
}

/// Binds the calling thread (worker `n`) as the configuration says, and
/// logs it as nginx does. CPUs the machine does not have are left out
/// (with `auto`, worker N takes the N-th CPU the machine has in the mask).
pub fn bind_worker(main: &MainConf, n: usize) {
    let Some(a) = &main.cpu_affinity else { return };
    let online = std::thread::available_parallelism().map_or(1, |p| p.get());
    let a = match a {
        CpuAffinity::Auto(cpus) => {
            CpuAffinity::Auto(cpus.iter().copied().filter(|&c| c < online).collect())
        }
        other => other.clone(),
    };
    let cpus = a.cpus_of(n);
    if cpus.is_empty() {
        return;
    }
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in &cpus {
        crate::elog!(Notice, "sched_setaffinity(): using cpu #{}", c);
        // SAFETY: `c` < MAX_CPUS = CPU_SETSIZE, within the set's bits.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: pid 0 is the calling thread; `set` is a valid cpu_set_t of
    // the size passed.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        crate::elog!(
            Alert,
            "sched_setaffinity() failed {}",
            crate::core::errno_text(&e)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_and_auto_pick_cpus_as_nginx() {
        let m = CpuAffinity::Masks(vec![vec![0], vec![1, 3]]);
        assert_eq!(m.cpus_of(0), vec![0]);
        assert_eq!(m.cpus_of(1), vec![1, 3]);
        assert_eq!(m.cpus_of(5), vec![1, 3], "last mask for the rest");
        assert!(m.mismatch_warning(3).is_some());
        assert!(m.mismatch_warning(2).is_none());
        assert!(CpuAffinity::Masks(vec![vec![0]])
            .mismatch_warning(4)
            .is_none());
        let a = CpuAffinity::Auto(vec![2, 5]);
        assert_eq!(
            (a.cpus_of(0), a.cpus_of(1), a.cpus_of(2)),
            (vec![2], vec![5], vec![2])
        );
    }
}

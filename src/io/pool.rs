//! tern's own thread pools (`thread_pool NAME threads=N max_queue=M`).
//!
//! A pool is N OS threads named `tern-pool-NAME` sharing one FIFO queue
//! behind a mutex and a condvar. [`ThreadPool::run`] enqueues a closure and
//! awaits its result on a `tokio::sync::oneshot`; the worker loop never
//! blocks on the pool: if the queue is full the call fails at once with
//! [`IoError::Overflow`], worded as nginx words it.
//!
//! Queue bound, as nginx's `ngx_thread_task_post`: a task is accepted while
//! `waiting < max_queue`, where `waiting` = queued tasks minus threads that
//! are free to take one. So `max_queue=0` does *not* mean unlimited: it means
//! no task may wait, a task is accepted only when a thread is free.
//!
//! Lifecycle: [`Pools`] is built from [`IoMain`] and reconciled on reload.
//! A pool is shut down when its last `Arc` goes away (the old configuration
//! and every request still holding it) or by [`ThreadPool::shutdown`]:
//! it stops accepting, its threads finish every queued task, then exit.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;

use super::conf::{IoMain, PoolConf, DEFAULT_POOL};
use super::stats::{bump, PoolStats, STATS};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Errors of the offload machinery itself (not of the I/O done).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IoError {
    /// The bounded queue is full; the caller logs this at `error` level.
    Overflow { pool: String, waiting: usize },
    /// The pool was shut down before or while the task was queued.
    ShutDown { pool: String },
    /// The task panicked in the pool thread.
    Panicked { pool: String },
    /// `aio threads=$var` resolved to a pool that does not exist.
    NotFound { pool: String },
}

impl fmt::Display for IoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IoError::Overflow { pool, waiting } => {
                write!(
                    f,
                    "thread pool \"{}\" queue overflow: {} tasks waiting",
                    pool, waiting
                )
            }
            IoError::ShutDown { pool } => write!(f, "thread pool \"{}\" is shut down", pool),
            IoError::Panicked { pool } => write!(f, "task in thread pool \"{}\" panicked", pool),
            IoError::NotFound { pool } => write!(f, "thread pool \"{}\" not found", pool),
        }
    }
}

impl std::error::Error for IoError {}

impl From<IoError> for io::Error {
    fn from(e: IoError) -> io::Error {
        io::Error::other(e)
    }
}

impl IoError {
    /// The pool error inside an `io::Error` produced by this layer, if any.
    pub fn from_io(e: &io::Error) -> Option<&IoError> {
        e.get_ref().and_then(|i| i.downcast_ref::<IoError>())
    }
}

struct State {
    queue: VecDeque<Job>,
    /// Threads currently running a task.
    busy: usize,
    /// Threads started and not yet exited.
    alive: usize,
    stopping: bool,
    max_queued: usize,
    overflows: u64,
    done: u64,
}

struct Inner {
    conf: PoolConf,
    state: Mutex<State>,
    cond: Condvar,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave State inconsistent
        // (tasks run outside it), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A named pool of threads with a bounded queue.
pub struct ThreadPool {
    inner: Arc<Inner>,
    handles: Mutex<Vec<JoinHandle<()>>>,
}

impl fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThreadPool")
            .field("name", &self.inner.conf.name)
            .field("threads", &self.inner.conf.threads)
            .field("max_queue", &self.inner.conf.max_queue)
            .finish()
    }
}

impl ThreadPool {
    /// Starts `conf.threads` threads named `tern-pool-NAME`.
    pub fn start(conf: PoolConf) -> io::Result<ThreadPool> {
        let threads = conf.threads.max(1);
        let inner = Arc::new(Inner {
            conf,
            state: Mutex::new(State {
                queue: VecDeque::new(),
                busy: 0,
                alive: threads,
                stopping: false,
                max_queued: 0,
                overflows: 0,
                done: 0,
            }),
            cond: Condvar::new(),
        });
        let pool = ThreadPool {
            inner,
            handles: Mutex::new(Vec::with_capacity(threads)),
        };
        // Only a privileged spawner (the master) needs the init hook: a
        // thread spawned by a worker (the lazily started `default` pool)
        // inherits the worker's already dropped credentials, and dropping
        // them again would fail with EPERM.
        // SAFETY: geteuid has no preconditions and cannot fail.
        let privileged = unsafe { libc::geteuid() } == 0;
        for i in 0..threads {
            let inner = Arc::clone(&pool.inner);
            let spawned = std::thread::Builder::new()
                .name(format!("tern-pool-{}", pool.inner.conf.name))
                .spawn(move || worker(inner, privileged));
            match spawned {
                Ok(h) => pool.lock_handles().push(h),
                Err(e) => {
                    // Threads not started will never decrement `alive`.
                    pool.inner.lock().alive -= threads - i;
                    pool.shutdown();
                    return Err(e);
                }
            }
        }
        Ok(pool)
    }

    fn lock_handles(&self) -> MutexGuard<'_, Vec<JoinHandle<()>>> {
        self.handles.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn name(&self) -> &str {
        &self.inner.conf.name
    }

    pub fn conf(&self) -> &PoolConf {
        &self.inner.conf
    }

    /// Queues `f` (never blocks the caller) and awaits its result.
    /// A full queue fails immediately with [`IoError::Overflow`].
    pub async fn run<F, R>(&self, f: F) -> Result<R, IoError>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let inner = Arc::clone(&self.inner);
        self.post(Box::new(move || {
            let r = catch_unwind(AssertUnwindSafe(f));
            // Counted before the result is delivered, so a caller that has
            // its result also sees the task in the pool's counters.
            inner.lock().done += 1;
            // The receiver may be gone (request aborted): nothing to do.
            let _ = tx.send(r);
        }))?;
        match rx.await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(_panic)) => Err(IoError::Panicked {
                pool: self.name().to_string(),
            }),
            Err(_) => Err(IoError::ShutDown {
                pool: self.name().to_string(),
            }),
        }
    }

    fn post(&self, job: Job) -> Result<(), IoError> {
        let mut st = self.inner.lock();
        if st.stopping {
            return Err(IoError::ShutDown {
                pool: self.name().to_string(),
            });
        }
        let free = st.alive.saturating_sub(st.busy);
        let waiting = st.queue.len().saturating_sub(free);
        if st.queue.len() >= free + self.inner.conf.max_queue {
            st.overflows += 1;
            drop(st);
            bump(&STATS.overflows);
            let e = IoError::Overflow {
                pool: self.name().to_string(),
                waiting,
            };
            // nginx logs this in the task poster, on the cycle's log.
            crate::elog!(Error, "{}", e);
            return Err(e);
        }
        st.queue.push_back(job);
        st.max_queued = st.max_queued.max(st.queue.len());
        drop(st);
        self.inner.cond.notify_one();
        Ok(())
    }

    /// Stops accepting tasks; the threads run what is queued, then exit.
    /// Does not wait (safe to call from an event loop).
    pub fn shutdown(&self) {
        self.inner.lock().stopping = true;
        self.inner.cond.notify_all();
    }

    /// [`shutdown`](Self::shutdown), then waits for the threads to exit.
    /// Blocking: for the master thread and tests, never on a worker loop.
    pub fn shutdown_and_join(&self) {
        self.shutdown();
        let handles: Vec<_> = self.lock_handles().drain(..).collect();
        for h in handles {
            let _ = h.join();
        }
    }

    pub fn stats(&self) -> PoolStats {
        let st = self.inner.lock();
        PoolStats {
            name: self.inner.conf.name.clone(),
            threads: self.inner.conf.threads,
            max_queue: self.inner.conf.max_queue,
            queued: st.queue.len(),
            max_queued: st.max_queued,
            overflows: st.overflows,
            done: st.done,
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Run at the start of every pool thread (the master installs the switch
/// to the unprivileged `user` here, so pool threads never run as root).
static THREAD_INIT: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>> = std::sync::OnceLock::new();

/// Installs the per-thread start hook (once per process).
pub fn set_thread_init(f: Box<dyn Fn() + Send + Sync>) {
    let _ = THREAD_INIT.set(f);
}

fn worker(inner: Arc<Inner>, privileged: bool) {
    if privileged {
        if let Some(init) = THREAD_INIT.get() {
            init();
        }
    }
    let mut st = inner.lock();
    loop {
        if let Some(job) = st.queue.pop_front() {
            st.busy += 1;
            drop(st);
            job();
            st = inner.lock();
            st.busy -= 1;
            continue;
        }
        if st.stopping {
            st.alive -= 1;
            return;
        }
        st = inner.cond.wait(st).unwrap_or_else(|p| p.into_inner());
    }
}

/// The set of pools of one configuration.
#[derive(Debug, Default)]
pub struct Pools {
    map: HashMap<String, Arc<ThreadPool>>,
    /// The implicit `default` pool (32 threads, max_queue 65536) when not
    /// declared: started on first use, so a config without `aio threads`
    /// costs no threads.
    lazy_default: OnceLock<Arc<ThreadPool>>,
}

impl Pools {
    /// Starts every declared pool. Called by the master before any thread
    /// drops privileges, which is also when the residency probe must open
    /// `/proc/self/pagemap` (see `resident.rs`).
    pub fn start(main: &IoMain) -> io::Result<Pools> {
        super::resident::init();
        Pools::default().reconcile(main)
    }

    /// The pools for a new configuration: a pool whose name, threads and
    /// max_queue are unchanged is kept (same threads, same queue); new or
    /// changed ones are started. Pools left out are not stopped here: they
    /// drain and stop when the old `Pools` and the requests still using them
    /// drop their last reference.
    pub fn reconcile(&self, main: &IoMain) -> io::Result<Pools> {
        let mut map = HashMap::new();
        for pc in &main.pools {
            let kept = self
                .get_existing(&pc.name)
                .filter(|p| p.conf().same_shape(pc));
            let pool = match kept {
                Some(p) => p,
                None => Arc::new(ThreadPool::start(pc.clone())?),
            };
            map.insert(pc.name.clone(), pool);
        }
        let lazy_default = OnceLock::new();
        if !map.contains_key(DEFAULT_POOL) {
            if let Some(p) = self.get_existing(DEFAULT_POOL) {
                if p.conf().same_shape(&PoolConf::default_pool()) {
                    let _ = lazy_default.set(p);
                }
            }
        }
        Ok(Pools { map, lazy_default })
    }

    fn get_existing(&self, name: &str) -> Option<Arc<ThreadPool>> {
        self.map.get(name).cloned().or_else(|| {
            if name == DEFAULT_POOL {
                self.lazy_default.get().cloned()
            } else {
                None
            }
        })
    }

    /// The pool called `name` (`default` always exists, started lazily).
    pub fn get(&self, name: &str) -> Option<Arc<ThreadPool>> {
        if let Some(p) = self.get_existing(name) {
            return Some(p);
        }
        if name != DEFAULT_POOL {
            return None;
        }
        if let Some(p) = self.lazy_default.get() {
            return Some(Arc::clone(p));
        }
        let p = Arc::new(ThreadPool::start(PoolConf::default_pool()).ok()?);
        Some(Arc::clone(self.lazy_default.get_or_init(|| p)))
    }

    /// Like [`get`](Self::get), with nginx's `thread pool "X" not found`.
    pub fn resolve(&self, name: &str) -> Result<Arc<ThreadPool>, IoError> {
        self.get(name).ok_or_else(|| IoError::NotFound {
            pool: name.to_string(),
        })
    }

    /// Counters of every started pool.
    pub fn stats(&self) -> Vec<PoolStats> {
        let mut v: Vec<PoolStats> = self.map.values().map(|p| p.stats()).collect();
        if let Some(p) = self.lazy_default.get() {
            v.push(p.stats());
        }
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::test_files::rt;
    use std::sync::mpsc;
    use std::time::Duration;

    fn pc(name: &str, threads: usize, max_queue: usize) -> PoolConf {
        PoolConf {
            name: name.into(),
            threads,
            max_queue,
            file: None,
            line: 0,
        }
    }

    #[test]
    fn overflow_with_one_thread_one_slot() {
        let pool = Arc::new(ThreadPool::start(pc("t1", 1, 1)).expect("start"));
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        let (started_tx, started_rx) = mpsc::channel::<()>();
        rt().block_on(async {
            // A occupies the only thread until the gate opens.
            let p = Arc::clone(&pool);
            let a = tokio::spawn(async move {
                p.run(move || {
                    let _ = started_tx.send(());
                    let _ = gate_rx.recv();
                    1
                })
                .await
            });
            while started_rx.try_recv().is_err() {
                tokio::task::yield_now().await;
            }
            // B waits in the queue (1 slot).
            let p = Arc::clone(&pool);
            let b = tokio::spawn(async move { p.run(|| 2).await });
            tokio::task::yield_now().await;
            assert_eq!(pool.stats().queued, 1);
            // C overflows immediately.
            let c = pool.run(|| 3).await;
            assert_eq!(
                c,
                Err(IoError::Overflow {
                    pool: "t1".into(),
                    waiting: 1
                })
            );
            assert_eq!(
                c.map_err(|e| e.to_string()),
                Err("thread pool \"t1\" queue overflow: 1 tasks waiting".to_string())
            );
            let _ = gate_tx.send(());
            assert_eq!(a.await.ok(), Some(Ok(1)));
            assert_eq!(b.await.ok(), Some(Ok(2)));
        });
        let s = pool.stats();
        assert_eq!((s.overflows, s.done, s.max_queued), (1, 2, 1));
        pool.shutdown_and_join();
    }

    #[test]
    fn max_queue_zero_accepts_only_with_free_thread() {
        let pool = ThreadPool::start(pc("z", 1, 0)).expect("start");
        rt().block_on(async {
            assert_eq!(pool.run(|| 5).await, Ok(5));
        });
        pool.shutdown_and_join();
    }

    #[test]
    fn shutdown_drains_queue() {
        let pool = Arc::new(ThreadPool::start(pc("drain", 1, 100)).expect("start"));
        let (tx, rx) = mpsc::channel::<usize>();
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        rt().block_on(async {
            let mut handles = Vec::new();
            let p = Arc::clone(&pool);
            handles.push(tokio::spawn(async move {
                p.run(move || {
                    let _ = gate_rx.recv();
                })
                .await
            }));
            for i in 0..10 {
                let p = Arc::clone(&pool);
                let tx = tx.clone();
                handles.push(tokio::spawn(async move {
                    p.run(move || {
                        std::thread::sleep(Duration::from_millis(2));
                        let _ = tx.send(i);
                    })
                    .await
                }));
            }
            tokio::task::yield_now().await;
            pool.shutdown();
            assert!(matches!(
                pool.run(|| ()).await,
                Err(IoError::ShutDown { .. })
            ));
            let _ = gate_tx.send(());
            for h in handles {
                assert_eq!(h.await.ok(), Some(Ok(())));
            }
        });
        pool.shutdown_and_join();
        drop(tx);
        let got: Vec<usize> = rx.iter().collect();
        assert_eq!(got, (0..10).collect::<Vec<_>>());
        assert_eq!(pool.stats().done, 11);
    }

    #[test]
    fn panicking_task_is_an_error_not_a_dead_pool() {
        let pool = ThreadPool::start(pc("p", 1, 4)).expect("start");
        rt().block_on(async {
            let r: Result<(), _> = pool.run(|| panic!("boom")).await;
            assert_eq!(r, Err(IoError::Panicked { pool: "p".into() }));
            assert_eq!(pool.run(|| 7).await, Ok(7));
        });
        pool.shutdown_and_join();
    }

    #[test]
    fn reconcile_keeps_unchanged_pools() {
        let m1 = IoMain {
            pools: vec![pc("a", 1, 10), pc("b", 1, 10)],
        };
        let p1 = Pools::start(&m1).expect("start");
        let m2 = IoMain {
            pools: vec![pc("a", 1, 10), pc("b", 2, 10), pc("c", 1, 1)],
        };
        let p2 = p1.reconcile(&m2).expect("reconcile");
        let same = |x: &Option<Arc<ThreadPool>>, y: &Option<Arc<ThreadPool>>| match (x, y) {
            (Some(x), Some(y)) => Arc::ptr_eq(x, y),
            _ => false,
        };
        assert!(same(&p1.get("a"), &p2.get("a")));
        assert!(!same(&p1.get("b"), &p2.get("b")));
        assert!(p1.get("c").is_none() && p2.get("c").is_some());
        assert!(p2.get("nope").is_none());
        assert_eq!(
            p2.resolve("nope").map(|_| ()).map_err(|e| e.to_string()),
            Err("thread pool \"nope\" not found".to_string())
        );
        let d1 = p2.get("default");
        let p3 = p2.reconcile(&m2).expect("reconcile");
        assert!(same(&d1, &p3.get("default")));
        assert_eq!(p3.get("default").map(|p| p.conf().threads), Some(32));
    }
}

//! Typed configuration of the I/O layer: [`IoMain`] (declared thread pools)
//! and [`IoLoc`] (per-location settings, every field optional so that
//! http -> server -> location inheritance is a plain [`IoLoc::merge`]).

use std::path::PathBuf;
use std::sync::Arc;

use crate::config::{ConfError, ConfResult};

/// The pool that `aio threads` (without a name) uses, and its defaults when
/// it is not declared, as in nginx.
pub const DEFAULT_POOL: &str = "default";
pub const DEFAULT_THREADS: usize = 32;
pub const DEFAULT_MAX_QUEUE: usize = 65536;

/// `directio_alignment` default.
pub const DEFAULT_DIRECTIO_ALIGNMENT: u64 = 512;
/// `sendfile_max_chunk` default (nginx >= 1.21.4).
pub const DEFAULT_SENDFILE_MAX_CHUNK: u64 = 2 * 1024 * 1024;
/// `output_buffers` default.
pub const DEFAULT_OUTPUT_BUFFERS: (usize, usize) = (2, 32 * 1024);

/// One `thread_pool NAME threads=N [max_queue=M];`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConf {
    pub name: String,
    pub threads: usize,
    /// Tasks allowed to wait for a free thread; 0 = none may wait.
    pub max_queue: usize,
    /// Where it was declared (for messages).
    pub file: Option<Arc<PathBuf>>,
    pub line: usize,
}

impl PoolConf {
    /// The implicit `default` pool.
    pub fn default_pool() -> PoolConf {
        PoolConf {
            name: DEFAULT_POOL.to_string(),
            threads: DEFAULT_THREADS,
            max_queue: DEFAULT_MAX_QUEUE,
            file: None,
            line: 0,
        }
    }

    /// Same pool for reload purposes: name, threads and max_queue equal.
    pub fn same_shape(&self, other: &PoolConf) -> bool {
        self.name == other.name
            && self.threads == other.threads
            && self.max_queue == other.max_queue
    }
}

/// Main-context I/O configuration: the declared thread pools.
#[derive(Debug, Clone, Default)]
pub struct IoMain {
    pub pools: Vec<PoolConf>,
}

impl IoMain {
    /// The declared pool called `name`.
    pub fn pool(&self, name: &str) -> Option<&PoolConf> {
        self.pools.iter().find(|p| p.name == name)
    }

    /// Every pool that will exist: the declared ones plus `default` with
    /// nginx's defaults when it is not declared.
    pub fn effective_pools(&self) -> Vec<PoolConf> {
        let mut v = self.pools.clone();
        if self.pool(DEFAULT_POOL).is_none() {
            v.push(PoolConf::default_pool());
        }
        v
    }

    /// Startup check of a location's `aio threads=NAME` with a literal name:
    /// nginx's `unknown thread pool "NAME" in FILE:LINE`. Names with
    /// variables are resolved per request (`thread pool "X" not found`).
    pub fn check_loc(&self, loc: &IoLoc) -> ConfResult<()> {
        if let Some(AioConf::Threads {
            pool: Some(name),
            file,
            line,
        }) = &loc.aio
        {
            if name.contains('$') || name == DEFAULT_POOL || self.pool(name).is_some() {
                return Ok(());
            }
            return Err(ConfError {
                msg: format!("unknown thread pool \"{}\"", name),
                file: file.as_ref().map(|f| (**f).clone()),
                line: *line,
            });
        }
        Ok(())
    }
}

/// The `aio` directive as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AioConf {
    Off,
    /// `aio on`: io_uring in tern (nginx: Linux native AIO + O_DIRECT).
    On,
    /// `aio threads[=NAME]`; `pool` is the raw NAME (may contain
    /// variables), `None` for the default pool.
    Threads {
        pool: Option<String>,
        file: Option<Arc<PathBuf>>,
        line: usize,
    },
}

/// Location-level I/O settings; `None` = not set here, inherit.
#[derive(Debug, Clone, Default)]
pub struct IoLoc {
    pub aio: Option<AioConf>,
    pub aio_write: Option<bool>,
    /// `directio SIZE|off`: `Some(None)` is an explicit `off`.
    pub directio: Option<Option<u64>>,
    pub directio_alignment: Option<u64>,
    pub sendfile_max_chunk: Option<u64>,
    pub read_ahead: Option<u64>,
    /// `output_buffers NUMBER SIZE`.
    pub output_buffers: Option<(usize, usize)>,
}

impl IoLoc {
    /// Fills every unset field from `parent` (nginx's merge_loc_conf).
    pub fn merge(&mut self, parent: &IoLoc) {
        fn m<T: Clone>(c: &mut Option<T>, p: &Option<T>) {
            if c.is_none() {
                c.clone_from(p);
            }
        }
        m(&mut self.aio, &parent.aio);
        m(&mut self.aio_write, &parent.aio_write);
        m(&mut self.directio, &parent.directio);
        m(&mut self.directio_alignment, &parent.directio_alignment);
        m(&mut self.sendfile_max_chunk, &parent.sendfile_max_chunk);
        m(&mut self.read_ahead, &parent.read_ahead);
        m(&mut self.output_buffers, &parent.output_buffers);
    }

    /// `aio` after defaults. nginx's default is `off`: a read of a file
    /// not in the page cache blocks the worker and every connection on it.
    /// tern's is `threads` on the default pool, because its offload costs
    /// nothing for cached data (those reads stay inline, see `io::ops`):
    /// only reads that would block leave the event loop. An explicit
    /// `aio off` reads inline as asked (DIFFERENCES.md).
    pub fn aio(&self) -> &AioConf {
        static DEFAULT: AioConf = AioConf::Threads {
            pool: None,
            file: None,
            line: 0,
        };
        self.aio.as_ref().unwrap_or(&DEFAULT)
    }
    pub fn aio_write(&self) -> bool {
        self.aio_write.unwrap_or(false)
    }
    /// `directio` threshold; `None` = off (the default).
    pub fn directio(&self) -> Option<u64> {
        self.directio.flatten()
    }
    pub fn directio_alignment(&self) -> u64 {
        self.directio_alignment
            .unwrap_or(DEFAULT_DIRECTIO_ALIGNMENT)
    }
    /// 0 = unlimited, as in nginx.
    pub fn sendfile_max_chunk(&self) -> u64 {
        self.sendfile_max_chunk
            .unwrap_or(DEFAULT_SENDFILE_MAX_CHUNK)
    }
    pub fn read_ahead(&self) -> u64 {
        self.read_ahead.unwrap_or(0)
    }
    pub fn output_buffers(&self) -> (usize, usize) {
        self.output_buffers.unwrap_or(DEFAULT_OUTPUT_BUFFERS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The io directives parse sizes with the shared parsers
    /// (`config::value::size` without `g`, `offset` with it).
    #[test]
    fn sizes() {
        use crate::config::value::{offset, size};
        let parse_size = |s: &str, allow_g: bool| if allow_g { offset(s) } else { size(s) };
        assert_eq!(parse_size("0", false), Some(0));
        assert_eq!(parse_size("512", false), Some(512));
        assert_eq!(parse_size("32k", false), Some(32768));
        assert_eq!(parse_size("2M", false), Some(2 << 20));
        assert_eq!(parse_size("1g", false), None);
        assert_eq!(parse_size("1g", true), Some(1 << 30));
        assert_eq!(parse_size("", true), None);
        assert_eq!(parse_size("k", true), None);
        assert_eq!(parse_size("-1", true), None);
        assert_eq!(parse_size("1.5k", true), None);
        assert_eq!(parse_size("99999999999999999999", true), None);
        assert_eq!(parse_size("9999999999999g", true), None);
    }

    #[test]
    fn merge_fills_unset_only() {
        let parent = IoLoc {
            aio: Some(AioConf::On),
            sendfile_max_chunk: Some(1),
            directio: Some(Some(4096)),
            ..Default::default()
        };
        let mut child = IoLoc {
            directio: Some(None),
            ..Default::default()
        };
        child.merge(&parent);
        assert_eq!(child.aio(), &AioConf::On);
        assert_eq!(child.sendfile_max_chunk(), 1);
        assert_eq!(child.directio(), None);
        assert_eq!(child.directio_alignment(), 512);
        assert_eq!(child.output_buffers(), (2, 32768));
    }
}

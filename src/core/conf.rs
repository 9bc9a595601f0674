//! Main-context configuration and the compiler state passed to setters.
use std::path::PathBuf;

/// Directives of the main and `events` contexts.
#[derive(Debug, Clone, Default)]
pub struct MainConf {
    pub io: crate::io::IoMain,
}

/// State available to directive setters while compiling.
#[derive(Debug, Default)]
pub struct Compiler {
    /// `-p` prefix, with a trailing slash.
    pub prefix: PathBuf,
    /// Directory of the main config file (base of `include`).
    pub conf_prefix: PathBuf,
}

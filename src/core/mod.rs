//! Process-level machinery: compiled main configuration, master and workers.
pub mod conf;

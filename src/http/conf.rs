//! Typed, merged http/server/location configuration.

/// State shared by the whole `http` block.
#[derive(Debug, Clone, Default)]
pub struct HttpMain {}

/// Server-level configuration.
#[derive(Debug, Clone, Default)]
pub struct SrvConf {}

/// Location-level configuration: one field per module.
#[derive(Debug, Clone, Default)]
pub struct LocConf {
    pub io: crate::io::IoLoc,
}

//! FastCGI (placeholder while the shared upstream side is factored out).
use super::proxy::ProxyLoc;

#[derive(Debug, Clone, Default)]
pub struct FastcgiLoc {
    pub up: ProxyLoc,
}

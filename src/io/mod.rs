//! The file-I/O layer (placeholder).
#[derive(Debug, Clone, Default)]
pub struct IoMain {}
#[derive(Debug, Clone, Default)]
pub struct IoLoc {}

//! Value parsers (placeholder).

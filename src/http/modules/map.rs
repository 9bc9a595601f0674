//! `map` and `split_clients`: computed variables.
//!
//! Placeholder: the directive table is empty until the module lands.

use crate::config::registry::Spec;

pub const DIRECTIVES: &[Spec] = &[];

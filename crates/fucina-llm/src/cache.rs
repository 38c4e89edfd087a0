//! PLACEHOLDER: being written (see the crate documentation).

//! PLACEHOLDER: this op family is being written.

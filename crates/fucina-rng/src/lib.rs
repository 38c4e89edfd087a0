//! fucina-rng: work in progress (being written in this change).

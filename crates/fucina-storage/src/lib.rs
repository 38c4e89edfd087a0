//! fucina-storage: work in progress (being written in this change).

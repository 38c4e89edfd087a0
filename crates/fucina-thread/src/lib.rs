//! fucina-thread: work in progress (being written in this change).

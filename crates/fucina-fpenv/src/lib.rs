//! fucina-fpenv: work in progress (being written in this change).

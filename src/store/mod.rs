//! Models on disk: single-file packing (and, later, the download store).

pub mod pack;
pub mod summary;

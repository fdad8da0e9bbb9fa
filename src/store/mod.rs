//! Models on disk: the model store (the HuggingFace hub cache), single-file packing, summaries.

pub mod cache;
pub mod http;
pub mod pack;
pub mod pull;
pub mod summary;

//! Models on disk: the model store (the HuggingFace hub cache), single-file packing, summaries,
//! synthetic models (random weights drawn at load).

pub mod cache;
pub mod http;
pub mod pack;
pub mod pull;
pub mod summary;
pub mod synthetic;

//! The model-agnostic engine: config and weight loading, tokenizer and chat template, sampling,
//! constrained decoding, per-layer caches and the generate loop. It names no model family's
//! parts; it sits below kernels and models (docs/architecture.md).

pub mod cache;
pub mod checkpoint;
pub mod compiled;
pub mod config;
pub mod contain;
pub mod device;
pub mod device_sampler;
pub mod distributed;
pub mod encoder;
pub mod error;
pub mod fixed_step;
pub mod generate;
pub mod generation_config;
pub mod gguf;
pub mod grammar;
pub mod logprobs;
pub mod memory;
pub mod model;
pub mod prefix_cache;
pub mod ops;
pub mod quant;
pub mod sampler;
pub mod session;
pub mod source;
pub mod state_file;
pub mod step_profile;
pub mod tensor_digests;
pub mod tokenizer;
pub mod tools;
pub mod weights;

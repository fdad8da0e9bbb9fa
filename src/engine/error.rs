//! Typed errors for everything a user can get wrong: each names the file, key or tensor involved
//! and, where there is one, the fix.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{path}: not valid JSON: {message}")]
    Json { path: PathBuf, message: String },

    #[error("{path}: missing key `{key}`, which has no default: the file must set it")]
    MissingKey { path: PathBuf, key: String },

    #[error("{path}: key `{key}`: {message}")]
    InvalidKey { path: PathBuf, key: String, message: String },

    #[error("{path}: model_type `{model_type}` is not supported (supported: {supported})")]
    UnsupportedModel { path: PathBuf, model_type: String, supported: String },

    #[error("{path}: {message}")]
    BadWeights { path: PathBuf, message: String },

    #[error("prompt cache {path}: {message}")]
    PromptCache { path: PathBuf, message: String },

    #[error("{path}: missing tensor `{name}` (expected shape {expected:?}); is this checkpoint for this model?")]
    MissingTensor { path: PathBuf, name: String, expected: Vec<i32> },

    #[error("{path}: tensor `{name}` has shape {found:?}, expected {expected:?}")]
    TensorShape { path: PathBuf, name: String, expected: Vec<i32>, found: Vec<i32> },

    #[error("{path}: unexpected tensor `{name}`: not part of a `{model_type}` model (misnamed checkpoint?)")]
    UnexpectedTensor { path: PathBuf, name: String, model_type: String },

    #[error("prompt has {prompt_tokens} tokens but the context limit is {limit} tokens (max_position_embeddings); shorten the prompt")]
    ContextOverflow { prompt_tokens: usize, limit: usize },

    #[error("token id {id} is outside the vocabulary (size {vocab})")]
    TokenOutOfRange { id: u32, vocab: usize },

    #[error("tokenizer: {0}")]
    Tokenizer(String),

    #[error("chat template: {0}")]
    Template(String),

    #[error("grammar: {0}")]
    Grammar(String),

    #[error("{0}")]
    Usage(String),

    /// `--model` names no file or folder and no model in the store.
    #[error(
        "{name}: no such file or directory, and not in the model store ({}){similar}; `sala list` shows the models there, `sala pull {pull}` fetches one from the hub",
        .store.display()
    )]
    ModelNotFound {
        name: String,
        store: PathBuf,
        /// Models in the store whose names contain it, as `; it has …`, or empty.
        similar: String,
        /// What to pull: the name itself when it is `org/name`, else `ORG/{name}`.
        pull: String,
    },

    #[error("MLX: {0}")]
    Mlx(#[from] mlx_rs::error::Exception),
}

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }
}

impl From<mlx_rs::error::IoError> for Error {
    fn from(e: mlx_rs::error::IoError) -> Self {
        Error::Mlx(mlx_rs::error::Exception::custom(e.to_string()))
    }
}

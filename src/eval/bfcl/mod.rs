//! `sala bfcl`: the BFCL v4 (Berkeley Function Calling Leaderboard)
//! non-live AST evaluation, reimplemented to give the same verdicts as the
//! official `bfcl-eval` checker.
//!
//! * [`data`]: categories and the wheel's data files;
//! * [`prompt`]: hinted docs, the default system prompt, chat messages and
//!   FC tools, as BFCL builds them;
//! * [`decode`]: model reply → calls (prompt mode and FC mode);
//! * [`checker`]: BFCL's AST checker and irrelevance rule;
//! * [`score`]: accuracies and the `data_non_live.csv` row;
//! * [`value`], `pyexpr`, [`convert`]: the Python value model, the Python
//!   expression parser, and BFCL's Java/JavaScript type converters.

pub mod checker;
pub mod harness;
pub mod convert;
pub mod data;
pub mod decode;
pub mod prompt;
mod pyexpr;
pub mod score;
pub mod value;

pub use checker::{check, check_irrelevance, evaluate, Verdict};
pub use data::{load, Category, Entry, Language, Message};
pub use decode::{
    calls_from_json, calls_to_json, decode_fc, decode_fc_text, decode_prompt, Call, DecodeError,
};
pub use value::PyValue;

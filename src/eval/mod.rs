//! Evaluation: comparisons and benchmarks, and the table/CSV writers they share.

pub mod ask;
pub mod bench;
pub mod bfcl;
pub mod bench_report;
pub mod needle;
pub mod pypi;
pub mod quality;
pub mod quant_report;
pub mod report;

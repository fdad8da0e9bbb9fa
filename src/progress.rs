//! Progress bars on stderr (indicatif) for long work: downloads, prefill, state files, quantizing.
//! A leaf: every layer may draw one.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// A progress bar on stderr drawn with `template` (hidden when stderr is not a terminal).
pub fn progress_bar(total: u64, template: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    if std::io::stderr().is_terminal() {
        bar.set_style(ProgressStyle::with_template(template).expect("valid template"));
    } else {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar
}

/// A bar for work counted in `unit`s (runs, cells, entries): done/total, time elapsed and left,
/// and the item at hand as the message (cut to the terminal's width).
pub fn work_bar(total: u64, label: &str, unit: &str) -> ProgressBar {
    progress_bar(total, &format!("{label} {{bar:30}} {{pos}}/{{len}} {unit} · {{elapsed}} elapsed, eta {{eta}} · {{wide_msg}}"))
}

/// A line of news on stderr: above `bar` on a terminal, plainly when the bar is hidden (a pipe
/// or a log file still gets each result as it comes).
pub fn note(bar: &ProgressBar, line: &str) {
    if bar.is_hidden() {
        eprintln!("{line}");
    } else {
        bar.println(line);
    }
}

/// Writes `text` to stdout at once (results as they come), with `bar` on stderr moved out of
/// its way.
pub fn print_above(bar: &ProgressBar, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    bar.suspend(|| {
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(text.as_bytes()).and_then(|_| stdout.flush())
    })
}

/// A bar for reading a long prompt (4096 tokens or more) on a terminal; none for a short one.
pub fn prefill_bar(tokens: usize) -> Option<ProgressBar> {
    (tokens >= 4096 && std::io::stderr().is_terminal())
        .then(|| progress_bar(tokens as u64, "prefill {bar:40} {pos}/{len} tokens ({per_sec}, eta {eta})"))
}

/// A set of bars on stderr (a download's files), hidden when stderr is not a terminal.
pub fn bar_set() -> indicatif::MultiProgress {
    if std::io::stderr().is_terminal() {
        indicatif::MultiProgress::new()
    } else {
        indicatif::MultiProgress::with_draw_target(ProgressDrawTarget::hidden())
    }
}

/// A byte-counting progress bar on stderr.
pub fn bytes_progress(label: &str, total: u64) -> ProgressBar {
    progress_bar(total, &format!("{label} {{bar:40}} {{bytes}}/{{total_bytes}} ({{bytes_per_sec}}, eta {{eta}})"))
}

/// A `(done, total)` progress callback that moves `bar`.
pub fn progress_to(bar: &ProgressBar) -> impl Fn(u64, u64) + '_ {
    move |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    }
}

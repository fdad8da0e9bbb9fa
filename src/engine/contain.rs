//! Third-party code that reads files from the internet may panic on input it does not expect
//! (the `tokenizers` crate's JSON decoders `expect` their own parse). [`contain`] turns such a
//! panic into a typed error, and keeps the default hook from printing it as a crash.

use super::error::{Error, Result};
use std::cell::Cell;
use std::panic::AssertUnwindSafe;

thread_local! {
    static CONTAINING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`; a panic inside it becomes `Error::Usage` saying that `what` failed on this input.
pub fn contain<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !CONTAINING.with(Cell::get) {
                previous(info);
            }
        }));
    });
    let outer = CONTAINING.replace(true);
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(f));
    CONTAINING.set(outer);
    outcome.unwrap_or_else(|payload| {
        let why = panic_message(payload.as_ref()).unwrap_or_else(|| "no message".into());
        Err(Error::Usage(format!("{what} failed on this input ({why}); the file is corrupt or not supported")))
    })
}

/// The message a panic was raised with (`panic!` with a literal or a formatted one), if any.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> Option<String> {
    payload.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| payload.downcast_ref::<String>().cloned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_error_and_results_pass_through() {
        let e = contain("reading x", || -> Result<()> { panic!("bad byte") }).unwrap_err();
        assert!(e.to_string().contains("reading x failed") && e.to_string().contains("bad byte"), "{e}");
        assert_eq!(contain("reading x", || Ok(3)).unwrap(), 3);
        assert!(contain("reading x", || -> Result<()> { Err(Error::Usage("no".into())) }).is_err());
    }
}

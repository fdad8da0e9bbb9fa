fn main() {
    // Output piped into `head` that stops reading ends the process quietly, as with any Unix tool,
    // instead of a panic in println!. Sockets are unaffected: Rust's networking never raises
    // SIGPIPE (MSG_NOSIGNAL on Linux, SO_NOSIGPIPE on macOS).
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let code = match sala::cli::main() {
        Ok(()) => 0,
        Err(error) => {
            eprintln!("error: {error:#}");
            1
        }
    };
    sala::engine::device::finish(code);
    if code != 0 {
        std::process::exit(code);
    }
}

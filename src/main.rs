fn main() {
    // Output piped into `head` that stops reading ends the process quietly, as with any Unix tool,
    // instead of a panic in println!. Sockets are unaffected: Rust's networking never raises
    // SIGPIPE (MSG_NOSIGNAL on Linux, SO_NOSIGPIPE on macOS).
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let result = sala::cli::main();
    sala::engine::device::settle();
    if let Err(error) = result {
        eprintln!("error: {error:#}");
        std::process::exit(1);
    }
}

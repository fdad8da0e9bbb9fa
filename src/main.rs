fn main() {
    if let Err(error) = sala::cli::main() {
        eprintln!("error: {error:#}");
        std::process::exit(1);
    }
}

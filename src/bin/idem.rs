//! The `idem` command: parses options and hands over to [`idem::cli`].

fn main() -> std::process::ExitCode {
    idem::cli::main_with(idem::Registry::new())
}

//! The `pinboard` binary: everything is in [`pinboard::cli::main`].

fn main() -> std::process::ExitCode {
    pinboard::cli::main()
}

//! The `pinboard` binary, built inside this package so the fleet tests can
//! start it as a real process (`CARGO_BIN_EXE_fleet-pinboard`).

/// The allocator the `pinboard` binary uses.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    pinboard::cli::main()
}

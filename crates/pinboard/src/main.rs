//! The `pinboard` binary: everything is in [`pinboard::cli::main`].

/// mimalloc: the proxy allocates a few small buffers and header maps per
/// request, and spends about a tenth less CPU per request with it than with
/// the system allocator (`proxy-bench`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    pinboard::cli::main()
}

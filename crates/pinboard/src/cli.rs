//! The command-line entry point: parse config (flags and environment),
//! set up logging, bind, print the bound address, serve until SIGINT or
//! SIGTERM. The `pinboard` binary is this one call, so other packages (the
//! fleet tests) can build the same binary. `pinboard sim-coprocess` runs
//! [`crate::sim`] instead, and `pinboard workers|placements|drain|undrain|
//! wind-down|sweeper|moves` the operator commands of [`crate::operator_cli`].

use std::process::ExitCode;

use clap::Parser;

use crate::Config;

/// Exit code for invalid configuration (`EX_USAGE`).
const EXIT_CONFIG: u8 = 64;

/// Runs pinboard as a process; returns its exit code.
pub fn main() -> ExitCode {
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "sim-coprocess")
    {
        return crate::sim::main();
    }
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| crate::operator_cli::is_operator_command(&a))
    {
        return crate::operator_cli::main();
    }
    let config = Config::parse();
    // Text or JSON on stderr, colours only on a terminal (never into a log
    // file or a pipe); `RUST_LOG` filters, default info. Spans go out over
    // OTLP when the `OTEL_*` variables ask (`pinned_edge::trace`).
    if let Err(error) = config.log_settings().try_init() {
        eprintln!("pinboard: logging: {error}");
        return ExitCode::from(EXIT_CONFIG);
    }
    let problems = config.validate();
    if !problems.is_empty() {
        for problem in &problems {
            eprintln!("pinboard: {problem}");
        }
        return ExitCode::from(EXIT_CONFIG);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("pinboard: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let served = runtime.block_on(serve(config));
    // The spans still batched go out before the process ends.
    pinned_edge::trace::shutdown();
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("pinboard: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(config: Config) -> Result<(), Box<dyn std::error::Error>> {
    // Read the TLS files before binding: a bad one fails the start, naming
    // the file, before anything is announced.
    let scheme = match config.tls_server()? {
        Some(_) => "https",
        None => "http",
    };
    config.upstream_tls()?;
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    let addr = listener.local_addr()?;
    // Tests and scripts read this line to find a port-0 listener.
    println!("pinboard listening on {scheme}://{addr}");
    tracing::info!(%addr, lease_ttl_ms = config.lease_ttl_ms, quarantine_ms = config.quarantine_ms(), "pinboard started");
    crate::run(config, listener, shutdown_signal()).await?;
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}

//! With nothing exporting, the installed subscriber keeps the console's
//! level as the process's maximum: a per-request `debug_span!` is refused
//! at its call site's level check (no span made, nothing entered), as it
//! was before the console's filter became a per-layer one beside the OTLP
//! layer's.

use pinned_edge::logging::LogSettings;
use tracing::level_filters::LevelFilter;

#[test]
fn nothing_exporting_keeps_debug_spans_off_at_info() {
    // This test's process alone: the variables a developer's shell may set.
    for var in [
        "RUST_LOG",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ] {
        std::env::remove_var(var);
    }
    LogSettings::default()
        .try_init()
        .expect("the only subscriber");
    assert!(!pinned_edge::trace::active());
    assert_eq!(LevelFilter::current(), LevelFilter::INFO);
    let span = tracing::debug_span!(target: "pinboard::proxy", "proxy");
    assert!(span.is_disabled());
    assert!(tracing::enabled!(target: "pinboard::proxy", tracing::Level::INFO));
}

//! The link definitions the guide's chapters are rendered with on docs.rs.
//!
//! Each chapter's Markdown (`crates/pinned/guide/*.md`) ends with link
//! definitions for GitHub: relative `.md` paths and docs.rs URLs.
//! `rustdoc_links!` defines the same labels again and `crate::guide`
//! puts these definitions *before* each chapter; Markdown takes the first
//! definition of a label, so on docs.rs every label resolves as an
//! intra-doc link (checked by `cargo doc`) or a repository URL, and on
//! GitHub as the chapter's own. `tests/guide_links.rs` checks that every
//! label a chapter uses has both. This module must never hold anything but
//! link definitions.

/// The link definitions rustdoc reads before a chapter's own (which serve
/// GitHub): chapters as modules, API items as intra-doc paths, repository
/// files as URLs. Every label a chapter uses must be defined here.
macro_rules! rustdoc_links {
    () => {
        concat!(
            // Chapters.
            "[guide]: crate::guide\n",
            "[concepts]: crate::guide::concepts\n",
            "[first-object]: crate::guide::first_object\n",
            "[shared-state-and-auth]: crate::guide::shared_state_and_auth\n",
            "[durable-state-and-trays]: crate::guide::durable_state_and_trays\n",
            "[alarms-and-schedules]: crate::guide::alarms_and_schedules\n",
            "[sockets]: crate::guide::sockets\n",
            "[behind-pinboard]: crate::guide::behind_pinboard\n",
            "[operating-a-fleet]: crate::guide::operating_a_fleet\n",
            "[migrating-from-python]: crate::guide::migrating_from_python\n",
            "[guarantees-and-limits]: crate::guide::guarantees_and_limits\n",
            "[configuration]: crate::guide::configuration\n",
            "[wire]: crate::guide::wire\n",
            "[benchmarks]: crate::guide::benchmarks\n",
            "[trays-guarantee]: crate::guide::durable_state_and_trays#what-trays-guarantee\n",
            // API items.
            "[`Object`]: crate::Object\n",
            "[`Context`]: crate::Context\n",
            "[`Options`]: crate::Options\n",
            "[`HostOptions`]: crate::HostOptions\n",
            "[`Worker`]: crate::Worker\n",
            "[`Serve`]: crate::Serve\n",
            "[`State`]: crate::State\n",
            "[`Call`]: crate::Call\n",
            "[`Cluster`]: crate::Cluster\n",
            "[`Denial`]: crate::Denial\n",
            "[`InstanceStore`]: crate::InstanceStore\n",
            "[`Alarm`]: crate::Alarm\n",
            "[`Schedule`]: crate::Schedule\n",
            "[`Domain`]: crate::Domain\n",
            "[`Tray`]: crate::tray::Tray\n",
            "[`TrayHandler`]: crate::tray::TrayHandler\n",
            "[`TrayHandle`]: crate::tray::TrayHandle\n",
            "[`TrayCtx`]: crate::tray::TrayCtx\n",
            "[`Receipt`]: crate::tray::Receipt\n",
            "[`KeyedTrays`]: crate::tray::KeyedTrays\n",
            "[`pinned::ws`]: crate::ws\n",
            "[`Accept`]: crate::ws::Accept\n",
            "[`SocketError`]: crate::ws::SocketError\n",
            "[`Socket`]: crate::ws::Socket\n",
            "[`SocketOptions`]: crate::ws::SocketOptions\n",
            "[`StoreConfig`]: crate::pinned_store::StoreConfig\n",
            "[`pinned::logging`]: crate::logging\n",
            // Repository files.
            "[readme]: https://github.com/pinned-rs/pinned/blob/main/README.md\n",
            "[changelog]: https://github.com/pinned-rs/pinned/blob/main/CHANGELOG.md\n",
            "[examples]: https://github.com/pinned-rs/pinned/tree/main/examples\n",
            "[agent-example]: https://github.com/pinned-rs/pinned/blob/main/examples/agent.rs\n",
            "[pinboard-readme]: https://github.com/pinned-rs/pinned/blob/main/crates/pinboard/README.md\n",
            "[pinboard-run]: https://github.com/pinned-rs/pinned/blob/main/crates/pinboard/README.md#run-it\n",
            "[pinboard-tls]: https://github.com/pinned-rs/pinned/blob/main/crates/pinboard/README.md#tls\n",
            "[pinboard-tokens]: https://github.com/pinned-rs/pinned/blob/main/crates/pinboard/README.md#tokens\n",
            "[pinboard-operator-commands]: https://github.com/pinned-rs/pinned/blob/main/crates/pinboard/README.md#operator-commands\n",
            "[pinboard-operator-endpoints]: https://github.com/pinned-rs/pinned/blob/main/crates/pinboard/README.md#the-operator-endpoints\n",
            "[pinboard-dashboard]: https://github.com/pinned-rs/pinned/blob/main/crates/pinboard/README.md#the-dashboard\n",
            "[pinboard-python]: https://github.com/pinned-rs/pinned/blob/main/crates/pinboard/README.md#with-the-python-reference-worker\n",
            "[pinboard-http-surface]: https://github.com/pinned-rs/pinned/blob/main/crates/pinboard/README.md#http-surface\n",
            "[pinboard-worlds]: https://github.com/pinned-rs/pinned/blob/main/crates/pinboard/README.md#hostname-and-environment-worlds\n",
            "[pinboard-edge]: https://github.com/pinned-rs/pinned/blob/main/crates/pinboard/README.md#deadlines-and-bounds-at-the-edge\n",
            "[pinboard-placement]: https://github.com/pinned-rs/pinned/blob/main/crates/pinboard/README.md#placement-rows-store-loss-and-readiness\n",
            "[pinboard-sweeper]: https://github.com/pinned-rs/pinned/blob/main/crates/pinboard/README.md#alarms-and-durable-wake-the-sweeper\n",
            "[pinboard-metrics]: https://github.com/pinned-rs/pinned/blob/main/crates/pinboard/README.md#metrics\n",
            "[pinboard-logs]: https://github.com/pinned-rs/pinned/blob/main/crates/pinboard/README.md#logs\n",
            "[pinboard-traces]: https://github.com/pinned-rs/pinned/blob/main/crates/pinboard/README.md#traces\n",
            "[pinboard-simulation]: https://github.com/pinned-rs/pinned/blob/main/crates/pinboard/README.md#the-references-simulation-a-guarantee\n",
            "[pinboard-limits]: https://github.com/pinned-rs/pinned/blob/main/crates/pinboard/README.md#known-limits\n",
            "[store-readme]: https://github.com/pinned-rs/pinned/blob/main/crates/pinned-store/README.md\n",
            "[store-postgres]: https://github.com/pinned-rs/pinned/blob/main/crates/pinned-store/README.md#postgres\n",
            "[store-tls]: https://github.com/pinned-rs/pinned/blob/main/crates/pinned-store/README.md#connection-strings-and-tls\n",
            "[deploy]: https://github.com/pinned-rs/pinned/blob/main/deploy/README.md\n",
            "[monitoring]: https://github.com/pinned-rs/pinned/blob/main/deploy/monitoring/README.md\n",
            "[dashboard-png]: https://raw.githubusercontent.com/pinned-rs/pinned/main/docs/dashboard.png\n",
            "\n",
        )
    };
}

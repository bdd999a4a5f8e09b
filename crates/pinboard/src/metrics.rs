//! Prometheus metrics (`pinboard_*`), served on `GET /metrics`.
//!
//! Owns the metric set and its text encoding. Hot-path metrics are plain
//! label-free counters (one atomic add each); never blocks, never allocates
//! on the hot path.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Every pinboard metric.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Client requests handled by the proxy.
    pub proxy_requests: Counter,
    /// Attempts re-sent after a refusal or a failed connect.
    pub proxy_retries: Counter,
    /// Upstream transport failures (connect or mid-flight).
    pub proxy_upstream_errors: Counter,
    /// 503s answered because no worker could take the id.
    pub proxy_unavailable: Counter,
    /// WebSocket upgrades passed through.
    pub proxy_upgrades: Counter,
    /// WebSockets this node holds for their workers now (`crate::held`).
    pub held_sockets: Gauge,
    /// Held sockets' events answered by their owner.
    pub held_events: Counter,
    /// Held sockets' event deliveries tried again (no owner answered 2xx).
    pub held_event_retries: Counter,
    /// Messages, closes and attachments queued to held sockets by their
    /// workers' sends.
    pub held_sends: Counter,
    /// Publications of held-socket sends this node made to the other
    /// nodes (`crate::held::relay`).
    pub held_relay_published: Counter,
    /// Publications of other nodes this node delivered to its sockets.
    pub held_relay_received: Counter,
    /// Times the relay lost its subscription (and made it again).
    pub held_relay_losses: Counter,
    /// New placements claimed by this node.
    pub placements: Counter,
    /// Successful registrations.
    pub registrations: Counter,
    /// Successful heartbeats.
    pub heartbeats: Counter,
    /// Registry calls answered with an error status.
    pub registry_errors: Counter,
    /// Live workers in this node's view (set at scrape time).
    pub live_workers: Gauge,
    /// Routes in this node's cache (set at scrape time).
    pub cached_routes: Gauge,
    /// Sweeper laps run while holding the sweeper lease.
    pub sweep_laps: Counter,
    /// `_alarm` calls answered 200 (ran, or nothing was due).
    pub sweep_alarms_delivered: Counter,
    /// `_wake` calls answered 200 (resident) or 202 (activating).
    pub sweep_wakes: Counter,
    /// Sweeper scans and calls that failed or must be retried next lap.
    pub sweep_failures: Counter,
    /// 1 while this node holds the sweeper lease, else 0.
    pub sweep_lease_held: Gauge,
    /// When this node last started a sweeper lap (Unix ms; 0 before the first).
    pub sweep_last_lap_ms: Gauge,
    /// Proxied requests a worker did not answer within `--upstream-timeout-ms` (504).
    pub proxy_upstream_timeouts: Counter,
    /// Proxied requests whose client body failed or stalled (answered as the client's fault).
    pub proxy_client_body_errors: Counter,
    /// Relayed answers aborted because the worker paused their body longer
    /// than `--upstream-body-timeout-ms`.
    pub proxy_upstream_body_stalls: Counter,
    /// Client connections open now.
    pub connections_open: Gauge,
    /// Connections closed on arrival because the connection cap was reached.
    pub connections_refused: Counter,
    /// Connections closed because a request head was not complete in time.
    pub connections_header_timeouts: Counter,
    /// Keep-alive connections closed after idling too long.
    pub connections_idle_timeouts: Counter,
    /// Idle connections closed at the connection cap to admit a new one.
    pub connections_reclaimed: Counter,
    /// TLS handshakes that failed (a timed-out one counts as a header
    /// timeout instead).
    pub tls_handshake_failures: Counter,
    /// Failed accepts (out of file descriptors, say).
    pub accept_errors: Counter,
    /// Reads of the worker list from the placement store.
    pub store_worker_reads: Counter,
    /// Claims handed back because the worker refused to activate the id.
    pub placements_rolled_back: Counter,
    /// Times this node found the placement store's generation gone or changed.
    pub store_losses: Counter,
    /// Vacated placement rows handed their grace (or removed) by expiry passes.
    pub placement_rows_expired: Counter,
    /// Dashboard logins refused (429) because their address presented too
    /// many wrong tokens in the window.
    pub dashboard_logins_limited: Counter,
    /// Worker sessions whose lease lapsed, as this node's upkeep noticed.
    pub lease_lapses: Counter,
    /// Ids this node re-placed because their owner's lease lapsed or its
    /// process was replaced.
    pub failovers: Counter,
    /// 1 while this node places no new ids (a quarantine), else 0 (set at
    /// scrape time).
    pub quarantined: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric registered.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let m = Metrics {
            registry: Registry::default(),
            proxy_requests: Counter::default(),
            proxy_retries: Counter::default(),
            proxy_upstream_errors: Counter::default(),
            proxy_unavailable: Counter::default(),
            proxy_upgrades: Counter::default(),
            held_sockets: Gauge::default(),
            held_events: Counter::default(),
            held_event_retries: Counter::default(),
            held_sends: Counter::default(),
            held_relay_published: Counter::default(),
            held_relay_received: Counter::default(),
            held_relay_losses: Counter::default(),
            placements: Counter::default(),
            registrations: Counter::default(),
            heartbeats: Counter::default(),
            registry_errors: Counter::default(),
            live_workers: Gauge::default(),
            cached_routes: Gauge::default(),
            sweep_laps: Counter::default(),
            sweep_alarms_delivered: Counter::default(),
            sweep_wakes: Counter::default(),
            sweep_failures: Counter::default(),
            sweep_lease_held: Gauge::default(),
            sweep_last_lap_ms: Gauge::default(),
            proxy_upstream_timeouts: Counter::default(),
            proxy_client_body_errors: Counter::default(),
            proxy_upstream_body_stalls: Counter::default(),
            connections_open: Gauge::default(),
            connections_refused: Counter::default(),
            connections_header_timeouts: Counter::default(),
            connections_idle_timeouts: Counter::default(),
            connections_reclaimed: Counter::default(),
            tls_handshake_failures: Counter::default(),
            accept_errors: Counter::default(),
            store_worker_reads: Counter::default(),
            placements_rolled_back: Counter::default(),
            store_losses: Counter::default(),
            dashboard_logins_limited: Counter::default(),
            lease_lapses: Counter::default(),
            failovers: Counter::default(),
            quarantined: Gauge::default(),
            placement_rows_expired: Counter::default(),
        };
        // prometheus-client appends `_total` to counters.
        registry.register(
            "pinboard_proxy_requests",
            "Client requests handled by the proxy",
            m.proxy_requests.clone(),
        );
        registry.register(
            "pinboard_proxy_retries",
            "Proxy attempts re-sent after a refusal or failed connect",
            m.proxy_retries.clone(),
        );
        registry.register(
            "pinboard_proxy_upstream_errors",
            "Upstream transport failures",
            m.proxy_upstream_errors.clone(),
        );
        registry.register(
            "pinboard_proxy_unavailable",
            "503s for ids no worker could take",
            m.proxy_unavailable.clone(),
        );
        registry.register(
            "pinboard_proxy_upgrades",
            "WebSocket upgrades passed through",
            m.proxy_upgrades.clone(),
        );
        registry.register(
            "pinboard_held_sockets",
            "WebSockets this node holds for their workers",
            m.held_sockets.clone(),
        );
        registry.register(
            "pinboard_held_socket_events",
            "Held sockets' events answered by their owner",
            m.held_events.clone(),
        );
        registry.register(
            "pinboard_held_socket_event_retries",
            "Held sockets' event deliveries tried again",
            m.held_event_retries.clone(),
        );
        registry.register(
            "pinboard_held_socket_sends",
            "Sends queued to held sockets by their workers",
            m.held_sends.clone(),
        );
        registry.register(
            "pinboard_held_relay_publications",
            "Publications of held-socket sends this node made to the other nodes",
            m.held_relay_published.clone(),
        );
        registry.register(
            "pinboard_held_relay_deliveries",
            "Publications of other nodes delivered to this node's held sockets",
            m.held_relay_received.clone(),
        );
        registry.register(
            "pinboard_held_relay_subscription_losses",
            "Times the held-socket relay lost its Redis subscription",
            m.held_relay_losses.clone(),
        );
        registry.register(
            "pinboard_placements",
            "New placements claimed by this node",
            m.placements.clone(),
        );
        registry.register(
            "pinboard_registrations",
            "Successful worker registrations",
            m.registrations.clone(),
        );
        registry.register(
            "pinboard_heartbeats",
            "Successful worker heartbeats",
            m.heartbeats.clone(),
        );
        registry.register(
            "pinboard_registry_errors",
            "Registry calls answered with an error",
            m.registry_errors.clone(),
        );
        registry.register(
            "pinboard_live_workers",
            "Live workers in this node's view",
            m.live_workers.clone(),
        );
        registry.register(
            "pinboard_cached_routes",
            "Routes in this node's cache",
            m.cached_routes.clone(),
        );
        registry.register(
            "pinboard_sweep_laps",
            "Sweeper laps run while holding the sweeper lease",
            m.sweep_laps.clone(),
        );
        registry.register(
            "pinboard_sweep_alarms_delivered",
            "Sweeper _alarm calls answered 200",
            m.sweep_alarms_delivered.clone(),
        );
        registry.register(
            "pinboard_sweep_wakes",
            "Sweeper _wake calls answered 200 or 202",
            m.sweep_wakes.clone(),
        );
        registry.register(
            "pinboard_sweep_failures",
            "Sweeper scans and calls that failed or are retried next lap",
            m.sweep_failures.clone(),
        );
        registry.register(
            "pinboard_sweep_lease_held",
            "Whether this node holds the sweeper lease (1) or not (0)",
            m.sweep_lease_held.clone(),
        );
        registry.register(
            "pinboard_sweep_last_lap_timestamp_ms",
            "When this node last started a sweeper lap (Unix ms; 0 before the first)",
            m.sweep_last_lap_ms.clone(),
        );
        registry.register(
            "pinboard_proxy_upstream_timeouts",
            "Proxied requests a worker did not answer in time (504)",
            m.proxy_upstream_timeouts.clone(),
        );
        registry.register(
            "pinboard_proxy_client_body_errors",
            "Proxied requests whose client body failed or stalled",
            m.proxy_client_body_errors.clone(),
        );
        registry.register(
            "pinboard_proxy_upstream_body_stalls",
            "Relayed answers aborted for a worker body pause over --upstream-body-timeout-ms",
            m.proxy_upstream_body_stalls.clone(),
        );
        registry.register(
            "pinboard_connections_open",
            "Client connections open now",
            m.connections_open.clone(),
        );
        registry.register(
            "pinboard_connections_refused",
            "Connections closed on arrival at the connection cap",
            m.connections_refused.clone(),
        );
        registry.register(
            "pinboard_connections_header_timeouts",
            "Connections closed because a request head was not complete in time",
            m.connections_header_timeouts.clone(),
        );
        registry.register(
            "pinboard_tls_handshake_failures",
            "TLS handshakes that failed (not TLS, no shared cipher, client gone)",
            m.tls_handshake_failures.clone(),
        );
        registry.register(
            "pinboard_connections_idle_timeouts",
            "Keep-alive connections closed after idling too long",
            m.connections_idle_timeouts.clone(),
        );
        registry.register(
            "pinboard_connections_reclaimed",
            "Idle connections (waiting for a request head) closed at the connection cap to admit a new one",
            m.connections_reclaimed.clone(),
        );
        registry.register(
            "pinboard_accept_errors",
            "Failed accepts (out of file descriptors, say)",
            m.accept_errors.clone(),
        );
        registry.register(
            "pinboard_store_worker_reads",
            "Reads of the worker list from the placement store",
            m.store_worker_reads.clone(),
        );
        registry.register(
            "pinboard_placements_rolled_back",
            "Claims handed back because the worker refused to activate the id",
            m.placements_rolled_back.clone(),
        );
        registry.register(
            "pinboard_store_losses",
            "Times this node found the placement store's generation gone or changed",
            m.store_losses.clone(),
        );
        registry.register(
            "pinboard_placement_rows_expired",
            "Vacated placement rows handed their grace or removed by expiry passes",
            m.placement_rows_expired.clone(),
        );
        registry.register(
            "pinboard_dashboard_logins_limited",
            "Dashboard logins refused (429) after too many wrong tokens from one address",
            m.dashboard_logins_limited.clone(),
        );
        registry.register(
            "pinboard_lease_lapses",
            "Worker sessions whose lease lapsed (noticed by this node's upkeep)",
            m.lease_lapses.clone(),
        );
        registry.register(
            "pinboard_failovers",
            "Ids re-placed because their owner's lease lapsed or its process was replaced",
            m.failovers.clone(),
        );
        registry.register(
            "pinboard_quarantined",
            "Whether this node places no new ids now (cold start or store loss): 1, else 0",
            m.quarantined.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Adds families computed at scrape time (per-namespace traffic).
    pub fn register_collector(&mut self, collector: Box<dyn Collector>) {
        self.registry.register_collector(collector);
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_pinboard_prefix() {
        let m = Metrics::new();
        m.proxy_requests.inc();
        let text = m.encode();
        assert!(text.contains("pinboard_proxy_requests_total 1"), "{text}");
        assert!(text.contains("pinboard_live_workers 0"), "{text}");
    }
}

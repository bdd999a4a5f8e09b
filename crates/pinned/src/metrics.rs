//! The worker's Prometheus metrics, named, typed and labelled as the Python
//! reference's `pinned_*` family so dashboards work across a mixed fleet.
//!
//! Each [`Worker`](crate::Worker) owns one registry (prometheus-client has no
//! global one). Hot-path handles (the per-namespace duration histogram) are
//! resolved once when a host is built, so a request never takes the family's
//! lock. This module never decides anything; it only counts.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The reference's histogram buckets (Python `prometheus_client` defaults).
const DURATION_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PhaseTransport {
    pub(crate) phase: &'static str,
    pub(crate) transport: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct Hook {
    pub(crate) hook: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct Phase {
    pub(crate) phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OperationReason {
    pub(crate) operation: &'static str,
    pub(crate) reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SideOutcome {
    pub(crate) side: &'static str,
    pub(crate) outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct Namespace {
    pub(crate) namespace: String,
}

/// Every `pinned_*` metric of one worker.
pub(crate) struct Metrics {
    registry: Registry,
    pub(crate) activations: Counter,
    pub(crate) evictions: Counter,
    pub(crate) aborts: Counter,
    pub(crate) active_instances: Gauge,
    /// Hibernatable sockets open.
    pub(crate) sockets_open: Gauge,
    /// Instances evicted while their sockets stayed open.
    pub(crate) hibernations: Counter,
    /// Socket events that activated their instance.
    pub(crate) socket_wakes: Counter,
    /// Socket messages answered by the auto-response.
    pub(crate) socket_auto_responses: Counter,
    pub(crate) lease_healthy: Gauge,
    pub(crate) registered: Gauge,
    pub(crate) registration_failures: Counter,
    pub(crate) duplicate_quits: Counter,
    /// Requests `Object::authorize` denied (not in the reference: there a
    /// denial of a cold request shows only as an eviction and an abort).
    pub(crate) auth_denials: Counter,
    /// Idle connections the edge closed at its connection cap to admit a
    /// new one (not in the reference, which has no cap).
    pub(crate) connections_reclaimed: Counter,
    /// Passes of the idle sweep, over every namespace (not in the
    /// reference).
    pub(crate) sweep_passes: Counter,
    /// Instance records the idle sweep's passes looked at: with passes,
    /// what one pass costs (not in the reference).
    pub(crate) sweep_visits: Counter,
    /// Seconds the idle sweep's passes took (not in the reference).
    pub(crate) sweep_seconds: Counter<f64, AtomicU64>,
    pub(crate) control_plane_failures: Family<OperationReason, Counter>,
    pub(crate) request_failures: Family<PhaseTransport, Counter>,
    callback_failures: Family<Hook, Counter>,
    tray_messages: Family<SideOutcome, Counter>,
    shutdown_failures: Family<Phase, Counter>,
    request_duration: Family<Namespace, Histogram>,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut registry = Registry::default();
        let activations = Counter::default();
        let evictions = Counter::default();
        let aborts = Counter::default();
        let active_instances = Gauge::default();
        let sockets_open: Gauge = Gauge::default();
        let hibernations = Counter::default();
        let socket_wakes = Counter::default();
        let socket_auto_responses = Counter::default();
        registry.register(
            "pinned_sockets_open",
            "Hibernatable WebSockets open in this process",
            sockets_open.clone(),
        );
        registry.register(
            "pinned_instance_hibernations",
            "Idle instances evicted while their hibernatable sockets stayed open",
            hibernations.clone(),
        );
        registry.register(
            "pinned_socket_wakes",
            "Socket events that activated their evicted instance",
            socket_wakes.clone(),
        );
        registry.register(
            "pinned_socket_auto_responses",
            "Socket messages answered by the auto-response without the instance",
            socket_auto_responses.clone(),
        );
        let lease_healthy: Gauge = Gauge::default();
        let registered: Gauge = Gauge::default();
        let registration_failures: Counter = Counter::default();
        let duplicate_quits: Counter = Counter::default();
        let auth_denials: Counter = Counter::default();
        let connections_reclaimed: Counter = Counter::default();
        let sweep_passes = Counter::default();
        let sweep_visits = Counter::default();
        let sweep_seconds = Counter::<f64, AtomicU64>::default();
        let request_failures = Family::default();
        let callback_failures: Family<Hook, Counter> = Family::default();
        let tray_messages: Family<SideOutcome, Counter> = Family::default();
        registry.register(
            "pinned_tray_messages",
            "Messages between objects: side sent (outcome delivered, refused, retried) or received (admitted, repeat)",
            tray_messages.clone(),
        );
        let shutdown_failures: Family<Phase, Counter> = Family::default();
        let control_plane_failures: Family<OperationReason, Counter> = Family::default();
        let request_duration = Family::<Namespace, Histogram>::new_with_constructor(
            (|| Histogram::new(DURATION_BUCKETS)) as fn() -> Histogram,
        );
        // prometheus-client appends `_total` to counters itself.
        registry.register(
            "pinned_instance_activations",
            "Pinned instance activations",
            activations.clone(),
        );
        registry.register(
            "pinned_instance_evictions",
            "Pinned instance closes (idle eviction, shutdown, or abort)",
            evictions.clone(),
        );
        registry.register(
            "pinned_instance_aborts",
            "Pinned instance closes that cancelled in-flight work",
            aborts.clone(),
        );
        registry.register(
            "pinned_active_instances",
            "Live pinned instances in this process",
            active_instances.clone(),
        );
        registry.register(
            "pinned_lease_healthy",
            "1 while heartbeat acks arrive on schedule, else 0",
            lease_healthy.clone(),
        );
        registry.register(
            "pinned_registered",
            "1 while registered with pinboard, else 0",
            registered.clone(),
        );
        registry.register(
            "pinned_registration_failures",
            "Failed pinboard register attempts",
            registration_failures.clone(),
        );
        registry.register(
            "pinned_duplicate_quits",
            "Pinned instances quit after a register ack reported their placement duplicated",
            duplicate_quits.clone(),
        );
        registry.register(
            "pinned_auth_denials",
            "Requests the object's authorize denied (its 401/403 or own answer)",
            auth_denials.clone(),
        );
        registry.register(
            "pinned_connections_reclaimed",
            "Idle connections (waiting for a request head) closed at the connection cap to admit a new one",
            connections_reclaimed.clone(),
        );
        registry.register(
            "pinned_idle_sweep_passes",
            "Passes of the idle sweep",
            sweep_passes.clone(),
        );
        registry.register(
            "pinned_idle_sweep_visits",
            "Instance records the idle sweep looked at",
            sweep_visits.clone(),
        );
        registry.register(
            "pinned_idle_sweep_seconds",
            "Seconds the idle sweep's passes took",
            sweep_seconds.clone(),
        );
        registry.register(
            "pinned_request_failures",
            "Pinned request setup failures by phase and transport",
            request_failures.clone(),
        );
        registry.register(
            "pinned_callback_failures",
            "Pinned lifecycle callback failures by hook",
            callback_failures.clone(),
        );
        registry.register(
            "pinned_shutdown_failures",
            "Pinned shutdown failures by phase",
            shutdown_failures.clone(),
        );
        registry.register(
            "pinned_control_plane_failures",
            "Pinned control-plane failures by operation and reason",
            control_plane_failures.clone(),
        );
        registry.register(
            "pinned_request_duration_seconds",
            "Pinned handler dispatch duration",
            request_duration.clone(),
        );
        // Local mode has no lease to lose.
        lease_healthy.set(1);
        Self {
            registry,
            activations,
            evictions,
            aborts,
            active_instances,
            sockets_open,
            hibernations,
            socket_wakes,
            socket_auto_responses,
            lease_healthy,
            registered,
            registration_failures,
            duplicate_quits,
            auth_denials,
            connections_reclaimed,
            sweep_passes,
            sweep_visits,
            sweep_seconds,
            control_plane_failures,
            request_failures,
            callback_failures,
            tray_messages,
            shutdown_failures,
            request_duration,
        }
    }

    /// The duration histogram of one namespace, resolved once per host.
    pub(crate) fn duration_for(&self, namespace: &str) -> Histogram {
        self.request_duration
            .get_or_create(&Namespace {
                namespace: namespace.to_owned(),
            })
            .clone()
    }

    pub(crate) fn request_failed(&self, phase: &'static str, transport: &'static str) {
        self.request_failures
            .get_or_create(&PhaseTransport { phase, transport })
            .inc();
    }

    /// One `pinned_tray_messages_total{side, outcome}`.
    pub(crate) fn tray_message(&self, side: &'static str, outcome: &'static str) {
        self.tray_messages
            .get_or_create(&SideOutcome { side, outcome })
            .inc();
    }

    /// One `pinned_callback_failures_total{hook}`: a lifecycle callback
    /// (`alarm`, ...) failed or panicked.
    pub(crate) fn callback_failed(&self, hook: &'static str) {
        self.callback_failures.get_or_create(&Hook { hook }).inc();
    }

    /// One `pinned_shutdown_failures_total{phase}`: a step of closing an
    /// instance (`directory`: its `on_stop`) or the worker failed.
    pub(crate) fn shutdown_failed(&self, phase: &'static str) {
        self.shutdown_failures.get_or_create(&Phase { phase }).inc();
    }

    /// One `pinned_control_plane_failures_total{operation, reason}`.
    pub(crate) fn control_failed(&self, operation: &'static str, reason: &'static str) {
        self.control_plane_failures
            .get_or_create(&OperationReason { operation, reason })
            .inc();
    }

    /// The registry in Prometheus text exposition format.
    pub(crate) fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

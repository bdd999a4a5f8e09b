//! Forwarding: a placement store built around another one (the Redis
//! Cluster store around its `{g}` tag and its shards, a test's gate around
//! any store) writes only the calls it changes; [`forward_calls!`] writes
//! each of the others as the same call on the store inside.
//!
//! The signatures are the [`PlacementStore`](super::PlacementStore)
//! trait's, once, here: a forwarded call that drifts from the trait fails
//! to compile in every store that forwards it. Owns no state and decides
//! nothing; a call that does anything besides forwarding is written out in
//! its store.

/// Writes, inside an `impl PlacementStore for …` block, the listed trait
/// methods as calls on an inner store:
///
/// - `forward_calls!(field: a, b, …)`: `self.field.a(…)`;
/// - `forward_calls!(route(instance): a, b, …)`: `self.route(instance).a(instance, …)`,
///   for the calls on one instance (`route` is a method of the outer
///   store taking the call's [`InstanceKey`](super::InstanceKey)).
macro_rules! forward_calls {
    ($field:ident: $($method:ident),+ $(,)?) => {
        $($crate::placement::forward::forward_calls!(@signature ($field) $method);)+
    };
    ($route:ident(instance): $($method:ident),+ $(,)?) => {
        $($crate::placement::forward::forward_calls!(@signature [$route] $method);)+
    };

    // The trait's signatures: the name, the arguments after `&self`, what
    // the call answers besides a `StoreError`.
    (@signature $to:tt deployment_version) => {
        $crate::placement::forward::forward_calls!(@call $to deployment_version() -> u64);
    };
    (@signature $to:tt admit_worker) => {
        $crate::placement::forward::forward_calls!(@call $to admit_worker(
            admission: &$crate::placement::Admission<'_>,
            now: $crate::clock::Now,
        ) -> bool);
    };
    (@signature $to:tt put_worker) => {
        $crate::placement::forward::forward_calls!(@call $to put_worker(
            record: &$crate::placement::WorkerRecord,
            ttl_ms: u64,
            now: $crate::clock::Now,
        ) -> ());
    };
    (@signature $to:tt renew_worker) => {
        $crate::placement::forward::forward_calls!(@call $to renew_worker(
            session_id: &str,
            headroom: i64,
            draining: bool,
            ttl_ms: u64,
            now: $crate::clock::Now,
        ) -> Option<$crate::placement::WorkerRecord>);
    };
    (@signature $to:tt set_server_drain) => {
        $crate::placement::forward::forward_calls!(@call $to set_server_drain(
            session_id: &str,
            drain: Option<$crate::placement::DrainDeadline>,
            now: $crate::clock::Now,
        ) -> bool);
    };
    (@signature $to:tt get_worker) => {
        $crate::placement::forward::forward_calls!(@call $to get_worker(
            session_id: &str,
            now: $crate::clock::Now,
        ) -> Option<$crate::placement::LiveWorker>);
    };
    (@signature $to:tt remove_worker) => {
        $crate::placement::forward::forward_calls!(@call $to remove_worker(session_id: &str) -> bool);
    };
    (@signature $to:tt list_workers) => {
        $crate::placement::forward::forward_calls!(@call $to list_workers(
            now: $crate::clock::Now,
        ) -> Vec<$crate::placement::LiveWorker>);
    };
    (@signature $to:tt bind_hostname) => {
        $crate::placement::forward::forward_calls!(@call $to bind_hostname(
            hostname: &str,
            now: $crate::clock::Now,
        ) -> ());
    };
    (@signature $to:tt bound_hostnames) => {
        $crate::placement::forward::forward_calls!(@call $to bound_hostnames() -> Vec<String>);
    };
    (@signature $to:tt mark_superseded) => {
        $crate::placement::forward::forward_calls!(@call $to mark_superseded(
            session_id: &str,
            error: &str,
            ttl_ms: u64,
            now: $crate::clock::Now,
        ) -> ());
    };
    (@signature $to:tt superseded) => {
        $crate::placement::forward::forward_calls!(@call $to superseded(
            session_id: &str,
            now: $crate::clock::Now,
        ) -> Option<String>);
    };
    (@signature $to:tt push_message) => {
        $crate::placement::forward::forward_calls!(@call $to push_message(
            session_id: &str,
            message: ::pinned_wire::registry::ControlMessage,
        ) -> String);
    };
    (@signature $to:tt pending_messages) => {
        $crate::placement::forward::forward_calls!(@call $to pending_messages(
            session_id: &str,
            acks: &[String],
        ) -> Vec<::pinned_wire::registry::ControlMessage>);
    };
    (@signature $to:tt resolve_or_claim) => {
        $crate::placement::forward::forward_calls!(@call $to resolve_or_claim(
            instance: $crate::placement::InstanceKey<'_>,
            candidate: Option<&str>,
            stale: Option<(&str, u64)>,
            floor: u64,
            generation: &$crate::placement::Generation,
            now: $crate::clock::Now,
        ) -> $crate::placement::ClaimOutcome);
    };
    (@signature $to:tt open_generation) => {
        $crate::placement::forward::forward_calls!(@call $to open_generation(
            proposal: &$crate::placement::Generation,
        ) -> $crate::placement::Generation);
    };
    (@signature $to:tt generation) => {
        $crate::placement::forward::forward_calls!(@call $to generation(
        ) -> Option<$crate::placement::Generation>);
    };
    (@signature $to:tt expire_placements) => {
        $crate::placement::forward::forward_calls!(@call $to expire_placements(
            budget: usize,
            now: $crate::clock::Now,
        ) -> usize);
    };
    (@signature $to:tt reclaim) => {
        $crate::placement::forward::forward_calls!(@call $to reclaim(
            instance: $crate::placement::InstanceKey<'_>,
            session_id: &str,
            prev_sessions: &[&str],
            floor: u64,
            now: $crate::clock::Now,
        ) -> $crate::placement::ReclaimOutcome);
    };
    (@signature $to:tt release) => {
        $crate::placement::forward::forward_calls!(@call $to release(
            instance: $crate::placement::InstanceKey<'_>,
            session_id: &str,
            epoch: Option<u64>,
        ) -> bool);
    };
    (@signature $to:tt tag) => {
        $crate::placement::forward::forward_calls!(@call $to tag(
            instance: $crate::placement::InstanceKey<'_>,
            session_id: &str,
            epoch: Option<u64>,
            tag: &str,
        ) -> bool);
    };
    (@signature $to:tt settle) => {
        $crate::placement::forward::forward_calls!(@call $to settle(
            instance: $crate::placement::InstanceKey<'_>,
            session_id: &str,
            epoch: u64,
        ) -> bool);
    };
    (@signature $to:tt wake_candidates) => {
        $crate::placement::forward::forward_calls!(@call $to wake_candidates(
            limit: usize,
            now: $crate::clock::Now,
        ) -> Vec<(String, String)>);
    };
    (@signature $to:tt placement) => {
        $crate::placement::forward::forward_calls!(@call $to placement(
            instance: $crate::placement::InstanceKey<'_>,
            now: $crate::clock::Now,
        ) -> Option<$crate::placement::PlacementEntry>);
    };
    (@signature $to:tt list_placements) => {
        $crate::placement::forward::forward_calls!(@call $to list_placements(
            now: $crate::clock::Now,
        ) -> Vec<$crate::placement::PlacementEntry>);
    };
    (@signature $to:tt acquire_sweeper_lease) => {
        $crate::placement::forward::forward_calls!(@call $to acquire_sweeper_lease(
            token: &str,
            ttl_ms: u64,
            now: $crate::clock::Now,
        ) -> bool);
    };
    (@signature $to:tt renew_sweeper_lease) => {
        $crate::placement::forward::forward_calls!(@call $to renew_sweeper_lease(
            token: &str,
            ttl_ms: u64,
            now: $crate::clock::Now,
        ) -> bool);
    };
    (@signature $to:tt release_sweeper_lease) => {
        $crate::placement::forward::forward_calls!(@call $to release_sweeper_lease(
            token: &str,
        ) -> bool);
    };

    // The call itself: on a field, or on the store a method routes the
    // call's first argument (its instance) to.
    (@call ($field:ident) $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $out:ty) => {
        async fn $name(&self, $($arg: $ty),*) -> Result<$out, $crate::placement::StoreError> {
            self.$field.$name($($arg),*).await
        }
    };
    (@call [$route:ident] $name:ident(
        $first:ident: $first_ty:ty $(, $arg:ident: $ty:ty)* $(,)?
    ) -> $out:ty) => {
        async fn $name(
            &self,
            $first: $first_ty,
            $($arg: $ty),*
        ) -> Result<$out, $crate::placement::StoreError> {
            self.$route($first).$name($first, $($arg),*).await
        }
    };
}

pub(crate) use forward_calls;

//! Running instance work detached from any request, and describing a
//! panic that escaped it.

/// Spawns `work` in `domain`; a no-op once the runtime is gone (a guard
/// dropped during runtime shutdown has nothing left to close).
pub(crate) fn spawn_detached(
    domain: &crate::time::Domain,
    work: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let _ = domain.try_spawn(work);
}

/// Runs `work`'s first poll here, on the caller's task, and the rest, if
/// it has to wait, in a task of `domain`'s (as an activation's first poll
/// runs on its requester's task). Work that needs no wait, such as most
/// idle closes, ends at once, without a task, its scheduling and its free
/// (`worker-bench`: about 2 200 instructions of each new id's eviction).
/// A domain with a runtime of its own, or a caller outside any runtime,
/// spawns as [`spawn_detached`] does. A panic in the first poll is caught
/// and the work dropped, as a detached task's panic is.
pub(crate) fn run_detached(
    domain: &crate::time::Domain,
    work: impl std::future::Future<Output = ()> + Send + 'static,
) {
    use futures_util::FutureExt as _;

    if domain.has_runtime() || tokio::runtime::Handle::try_current().is_err() {
        spawn_detached(domain, work);
        return;
    }
    let mut work = Box::pin(work);
    let first =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (&mut work).now_or_never()));
    if let Ok(None) = first {
        spawn_detached(domain, work);
    }
}

pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "panic".to_owned()
    }
}

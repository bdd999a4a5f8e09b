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

pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "panic".to_owned()
    }
}

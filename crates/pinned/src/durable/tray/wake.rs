//! Local mode's durable wake: with no pinboard sweeper to wake instances
//! whose rows claim work, the worker does it itself, once at start (a
//! crashed process resumes its trays with no request arriving) and after an
//! instance left with work still pending (an abort mid-dispatch).
//!
//! It only activates ids; what runs is the trays' business. It never
//! retries an id that fails to activate more than once per cause.

use std::sync::Arc;

use crate::namespace::Namespace;

/// Rows scanned per store page.
const PAGE: usize = 256;

/// Activates every id of `host`'s namespace with a marked row.
pub(crate) async fn wake_marked(host: Arc<Namespace>) {
    let Some(store) = host.store.clone() else {
        return;
    };
    // The index is ordered by (ns, id): start just before this namespace's
    // first id and stop at the first row of another, so each host reads
    // only its own namespace's rows.
    let mut after: (String, String) = (host.ns.to_string(), String::new());
    let mut woken = 0usize;
    loop {
        let page = match store
            .marked_instances(Some((after.0.as_str(), after.1.as_str())), PAGE)
            .await
        {
            Ok(page) => page,
            Err(error) => {
                tracing::error!(namespace = %host.ns, error = %pinned_edge::logging::Chain(&error), "could not list instances with pending tray work");
                return;
            }
        };
        let Some(last) = page.last().map(|m| (m.ns.clone(), m.id.clone())) else {
            break;
        };
        for pinned_store::MarkedInstance { ns, id, .. } in page {
            if ns != *host.ns {
                break;
            }
            if host.is_resident(&id) {
                continue;
            }
            if !wake(&host, &id).await {
                return;
            }
            woken += 1;
        }
        if last.0 != *host.ns {
            break;
        }
        after = last;
    }
    if woken > 0 {
        tracing::info!(namespace = %host.ns, woken, "woke instances with pending tray work");
    }
}

/// Activates `id` (its trays resume as part of the activation); false when
/// the worker refuses new activations (closed, full), so the caller stops.
pub(crate) async fn wake(host: &Arc<Namespace>, id: &str) -> bool {
    match host.enter(id, None).await {
        Ok((entry, _)) => {
            drop(entry);
            true
        }
        Err(crate::namespace::Admission::Refused(refusal)) => {
            tracing::warn!(namespace = %host.ns, %id, ?refusal, "could not wake an instance with pending tray work");
            false
        }
        Err(_) => {
            // Its activation failed (logged there); the others still wake.
            !host.is_shut_down()
        }
    }
}

//! The courier: one tray's loop that delivers its `~outgoing` messages to
//! their receivers through cluster calls, oldest first, one at a time, and
//! drops each once its receiver answered it.
//!
//! A letter leaves only once the write that queued it landed (a crash
//! before that never sent it), and the next one only once the receiver
//! answered the last: that order is what lets the receiver deduplicate by
//! a per-sender high-water mark. A failed delivery is retried after a
//! backoff (100 ms doubling to 10 s) for as long as the instance lives;
//! a winding-down instance stops delivering and its row, marked while
//! letters wait, wakes it on its next owner. It never admits anything
//! (the receiving route does) and never decides what a message is.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::StatusCode;

use super::frontier::Urgency;
use super::machine::{OpenTray, TrayState, OPEN};
use super::sends::{Draft, Letter, OUTGOING_KEY};
use super::{Tray, TrayError};
use crate::namespace::context::Context;
use crate::namespace::Record;
use crate::plane::cluster::Cluster;

/// The path, under the receiver's `/<ns>/<id>`, of the route that admits
/// messages.
pub(crate) const MESSAGE_PATH: &str = "/_pinned/messages";

/// First retry delay after a failed delivery; doubles per failure.
pub(crate) const RETRY_START: Duration = Duration::from_millis(100);
/// Longest retry delay.
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(10);
/// How long one delivery may take before it counts as failed.
pub(crate) const DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);
/// Most bytes of a refusal's answer kept for the log.
const MAX_REFUSAL_BYTES: usize = 4096;

fn retry_delay(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    RETRY_START.saturating_mul(1u32 << doublings).min(RETRY_MAX)
}

/// How one delivery ended.
enum Delivered {
    /// 200: admitted now or before.
    Answered,
    /// 422: the receiver will never take it (no such tray, a message its
    /// tray does not read).
    Refused(String),
    /// Anything else: try again.
    Failed(String),
}

async fn deliver(cluster: &Cluster, stream: &str, letter: &Letter) -> Delivered {
    let body = serde_json::json!({
        "stream": stream,
        "seq": letter.seq,
        "tray": letter.tray,
        "key": letter.key,
        "message": letter.message,
    });
    let Ok(body) = serde_json::to_vec(&body) else {
        return Delivered::Refused("the letter does not encode".to_owned());
    };
    let path = format!("{}/{}{MESSAGE_PATH}", letter.ns, letter.id);
    let request = match http::Request::post(&path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
    {
        Ok(request) => request,
        Err(error) => return Delivered::Refused(error.to_string()),
    };
    let call = tokio::time::timeout(DELIVERY_TIMEOUT, async {
        let response = cluster.send(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), MAX_REFUSAL_BYTES)
            .await
            .unwrap_or_default();
        Ok::<_, String>((status, String::from_utf8_lossy(&body).into_owned()))
    })
    .await;
    match call {
        Ok(Ok((StatusCode::OK, _))) => Delivered::Answered,
        Ok(Ok((StatusCode::UNPROCESSABLE_ENTITY, detail))) => Delivered::Refused(detail),
        Ok(Ok((status, detail))) => Delivered::Failed(format!("{status}: {detail}")),
        Ok(Err(error)) => Delivered::Failed(error),
        Err(_) => Delivered::Failed(format!("no answer within {DELIVERY_TIMEOUT:?}")),
    }
}

impl<T: Tray> OpenTray<T> {
    /// Copies the sends into the row's `~outgoing` entry.
    pub(crate) fn sync_sends(state: &mut TrayState<T>) -> Result<(), TrayError> {
        let entry = state.sends.entry()?;
        state.changed |= state.doc.put(OUTGOING_KEY, entry);
        Ok(())
    }

    /// Numbers and queues `drafts` (a handler's sends, with its ack; a
    /// handle's, in its own write), marking the row.
    pub(crate) fn queue_sends(
        state: &mut TrayState<T>,
        drafts: Vec<Draft>,
    ) -> Result<(), TrayError> {
        if drafts.is_empty() {
            return Ok(());
        }
        for draft in drafts {
            state.sends.push(draft);
        }
        Self::set_marked(state, true);
        Self::sync_sends(state)
    }

    /// Starts the courier unless it runs, nothing waits, the tray is
    /// retired or not open, or the instance winds down.
    pub(crate) fn start_courier(self: &Arc<Self>) {
        let Some(slot) = self.slot.upgrade() else {
            return;
        };
        if self.opened.load(std::sync::atomic::Ordering::SeqCst) != OPEN {
            return;
        }
        {
            let mut state = self.state.lock();
            if state.sends.running
                || state.sends.is_empty()
                || state.retired.is_some()
                || slot.winding_down()
            {
                return;
            }
            state.sends.running = true;
        }
        let tray = self.clone();
        Context::new(slot.clone()).spawn(async move {
            let mut running = CourierGuard { tray, armed: true };
            running.tray.deliver_all(&slot).await;
            running.armed = false;
        });
    }

    /// The next letter to deliver, once the write that queued it landed;
    /// `None` (the courier stopped) when there is none or it must stop.
    async fn next_letter(self: &Arc<Self>, slot: &Arc<Record>) -> Option<(String, Letter)> {
        let (stream, letter, receipt) = {
            let mut state = self.state.lock();
            let next = if state.retired.is_some() || slot.winding_down() {
                None
            } else {
                state
                    .sends
                    .front()
                    .map(|(stream, letter)| (stream.to_owned(), letter.clone()))
            };
            let Some((stream, letter)) = next else {
                state.sends.running = false;
                self.rest_if_dry(&mut state);
                return None;
            };
            // A handler's sends ride its ack, which may still wait for the
            // pump's next write: write it now.
            if self.commit(&mut state).is_err() {
                state.sends.running = false;
                return None;
            }
            (stream, letter, self.frontier.receipt())
        };
        if receipt.await.is_err() {
            self.state.lock().sends.running = false;
            return None;
        }
        Some((stream, letter))
    }

    async fn deliver_all(self: &Arc<Self>, slot: &Arc<Record>) {
        let ctx = Context::new(slot.clone());
        let cluster = ctx.cluster();
        let metrics = &slot.host.metrics;
        let mut failures = 0u32;
        while let Some((stream, letter)) = self.next_letter(slot).await {
            let delivered = deliver(&cluster, &stream, &letter).await;
            let to = format!("{}/{}/{}/{}", letter.ns, letter.id, letter.tray, letter.key);
            match delivered {
                Delivered::Answered | Delivered::Refused(_) => {
                    if let Delivered::Refused(detail) = &delivered {
                        metrics.tray_message("sent", "refused");
                        tracing::error!(namespace = %slot.host.ns, id = %slot.id, tray = %self.label(), %to, seq = letter.seq, %detail, "a message was refused by its receiver and dropped");
                    } else {
                        metrics.tray_message("sent", "delivered");
                        tracing::debug!(namespace = %slot.host.ns, id = %slot.id, tray = %self.label(), %to, seq = letter.seq, "message delivered");
                    }
                    failures = 0;
                    let mut state = self.state.lock();
                    if state.sends.answered(letter.seq) {
                        // Nobody waits for it: a lost drop only repeats
                        // the letter, and the receiver knows it.
                        let written = Self::sync_sends(&mut state)
                            .and_then(|()| self.commit_with(&mut state, Urgency::Soon));
                        if written.is_err() {
                            state.sends.running = false;
                            return;
                        }
                    }
                }
                Delivered::Failed(error) => {
                    metrics.tray_message("sent", "retried");
                    failures = failures.saturating_add(1);
                    let delay = retry_delay(failures);
                    // The first failure and every tenth after it: a
                    // receiver down for long must not flood the log.
                    if failures == 1 || failures.is_multiple_of(10) {
                        tracing::warn!(namespace = %slot.host.ns, id = %slot.id, tray = %self.label(), %to, seq = letter.seq, failures, ?delay, %error, "a message delivery failed; retrying");
                    } else {
                        tracing::debug!(namespace = %slot.host.ns, id = %slot.id, tray = %self.label(), %to, seq = letter.seq, failures, ?delay, %error, "a message delivery failed; retrying");
                    }
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        _ = ctx.wind_down_started() => {}
                    }
                }
            }
        }
    }

    /// Unmarks a tray whose last letter was answered when nothing else
    /// claims work (a pump under way decides for itself), and passivates
    /// it when it may.
    fn rest_if_dry(self: &Arc<Self>, state: &mut TrayState<T>) {
        if !state.sends.is_empty()
            || state.pumping
            || state.parked
            || !state.inbox.is_empty()
            || state.retired.is_some()
            || state.tray.head().is_some()
        {
            return;
        }
        Self::set_marked(state, false);
        if let Err(error) = self.commit_with(state, Urgency::Soon) {
            tracing::error!(tray = %self.label(), error = %pinned_edge::logging::Chain(&error), "could not unmark a tray whose messages were all delivered");
            return;
        }
        // The open map's reference and the courier's.
        if self.passivate_if_dry(state, 2) {
            self.close_later();
        }
    }
}

/// Clears the courier's flag when an abort drops it mid-delivery.
struct CourierGuard<T: Tray> {
    tray: Arc<OpenTray<T>>,
    armed: bool,
}

impl<T: Tray> Drop for CourierGuard<T> {
    fn drop(&mut self) {
        if self.armed {
            self.tray.state.lock().sends.running = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_from_a_tenth_of_a_second_up_to_ten() {
        assert_eq!(retry_delay(1), Duration::from_millis(100));
        assert_eq!(retry_delay(3), Duration::from_millis(400));
        assert_eq!(retry_delay(40), RETRY_MAX);
    }
}

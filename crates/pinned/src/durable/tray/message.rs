//! Messages between objects, as user code sees them: a tray that
//! [`Receive`]s, a [`Recipient`], the sends of a handler run
//! ([`TrayCtx::send`]) and of a handle ([`TrayHandle::send`]), and the
//! worker's receiving route that admits a message exactly once.
//!
//! A send is a letter in the sender tray's own row (`~outgoing`), queued
//! in the same write as the edit that sends, so it is durable when that
//! write is; the courier delivers it; the receiver admits it into its tray
//! together with its sender's new mark (`~received`) in one write and
//! answers 200 only once that write landed, for a new letter and a repeat
//! alike. This module never delivers and never retries (the courier does).

use std::sync::Arc;

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use futures_util::future::BoxFuture;
use http::StatusCode;
use pinned_wire::attestation::Caller;
use pinned_wire::ids;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use super::handle::{TrayCtx, TrayHandle};
use super::machine::OpenTray;
use super::open::InstanceTrays;
use super::received::{Window, RECEIVED_KEY};
use super::sends::Draft;
use super::{Receipt, Tray, TrayError, MAX_MESSAGE_BYTES, MAX_SENDER_WINDOW, SINGLETON_ID};
use crate::namespace::context::Context;
use crate::response::detail;

/// Longest tray key a recipient names, in bytes.
const MAX_KEY_BYTES: usize = 200;

/// A tray that other objects send messages to: how one message is
/// admitted. Declare it with [`Trays::receives`](super::Trays::receives).
///
/// `receive` runs once per message (a repeat of one admitted before is
/// answered without it), in the write that admits it, which also marks the
/// row as holding work: it usually pushes the message onto the queue the
/// tray's handler works.
pub trait Receive: Tray {
    /// What a message is, as JSON on its way.
    type Message: Serialize + DeserializeOwned + Send + 'static;

    /// Admits `message` into the tray's fields.
    fn receive(&mut self, message: Self::Message);
}

/// Where a message goes: a namespace, an instance id, and a tray key
/// ([`SINGLETON_ID`] for a singleton tray).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recipient {
    ns: String,
    id: String,
    key: String,
}

impl Recipient {
    /// The singleton tray of instance `id` of namespace `ns` (with its
    /// leading slash).
    pub fn singleton(ns: impl Into<String>, id: impl Into<String>) -> Self {
        Self::keyed(ns, id, SINGLETON_ID)
    }

    /// The keyed tray under `key` of instance `id` of namespace `ns`
    /// (created with the first message).
    pub fn keyed(ns: impl Into<String>, id: impl Into<String>, key: impl Into<String>) -> Self {
        Self {
            ns: ns.into(),
            id: id.into(),
            key: key.into(),
        }
    }

    /// The letter of `message` to this recipient's tray `R`.
    fn draft<R: Receive>(&self, message: &R::Message) -> Result<Draft, TrayError> {
        let ns_ok = ids::validate_namespace(&self.ns).is_ok()
            && self.ns[1..]
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'~' | b'-'));
        if !ns_ok {
            return Err(TrayError::Recipient(format!(
                "namespace {:?} must be / and [A-Za-z0-9._~-]",
                self.ns
            )));
        }
        ids::validate_id(&self.id)
            .map_err(|error| TrayError::Recipient(format!("id {:?}: {error}", self.id)))?;
        if self.key.is_empty() || self.key.len() > MAX_KEY_BYTES {
            return Err(TrayError::Recipient(
                "a tray key must be 1 to 200 bytes long".to_owned(),
            ));
        }
        let message =
            serde_json::to_value(message).map_err(|error| TrayError::Message(error.to_string()))?;
        let bytes = serde_json::to_vec(&message)
            .map_err(|error| TrayError::Message(error.to_string()))?
            .len();
        if bytes > MAX_MESSAGE_BYTES {
            return Err(TrayError::Message(format!("{bytes} bytes")));
        }
        Ok(Draft {
            ns: self.ns.clone(),
            id: self.id.clone(),
            tray: R::NAME,
            key: self.key.clone(),
            message,
            bytes,
        })
    }
}

impl<T: Tray> TrayCtx<T> {
    /// Sends `message` to tray `R` of `to`, exactly once: it is queued with
    /// this item's ack, in the same row write (a run that fails, or runs
    /// again after a crash, sent nothing), then delivered in the order
    /// sent, retried until the receiver answers, and admitted there once.
    ///
    /// # Errors
    ///
    /// [`TrayError::Recipient`] for an invalid namespace, id or key;
    /// [`TrayError::Message`] for a message that does not serialize or is
    /// larger than [`MAX_MESSAGE_BYTES`]; [`TrayError::OutboxFull`] when
    /// too many messages wait for their receivers.
    pub fn send<R: Receive>(&self, to: &Recipient, message: &R::Message) -> Result<(), TrayError> {
        let draft = to.draft::<R>(message)?;
        let mut staged = self.staged.lock();
        staged.sends.push(draft);
        let room = self.tray.state.lock().sends.check_room(&staged.sends);
        if room.is_err() {
            staged.sends.pop();
        }
        room
    }
}

impl<T: Tray> TrayHandle<T> {
    /// Sends `message` to tray `R` of `to` from this tray, in a write of
    /// its own (it is durable once the receipt resolves), then as
    /// [`TrayCtx::send`]: delivered in order, retried, admitted once.
    ///
    /// # Errors
    ///
    /// As [`TrayCtx::send`], and as [`admit`](Self::admit).
    pub fn send<R: Receive>(
        &self,
        to: &Recipient,
        message: &R::Message,
    ) -> Result<Receipt, TrayError> {
        let draft = to.draft::<R>(message)?;
        let receipt = {
            let mut state = self.tray.state.lock();
            self.tray.writable(&state)?;
            let drafts = vec![draft];
            state.sends.check_room(&drafts)?;
            OpenTray::<T>::queue_sends(&mut state, drafts)?;
            self.tray.commit(&mut state)?
        };
        self.tray.start_courier();
        Ok(receipt)
    }
}

/// A letter as the receiving route reads it.
#[derive(Debug, Deserialize)]
pub(crate) struct Inbound {
    stream: String,
    seq: u64,
    tray: String,
    key: String,
    message: Json,
}

/// Why a letter was not admitted.
enum NotAdmitted {
    /// 422: it never will be.
    Refused(String),
    /// Now: the tray's answer (a store failure, a closing instance).
    Tray(TrayError),
}

impl From<TrayError> for NotAdmitted {
    fn from(error: TrayError) -> Self {
        Self::Tray(error)
    }
}

type ReceiveFn =
    fn(Context, String, Inbound, bool) -> BoxFuture<'static, Result<bool, NotAdmitted>>;

/// One tray type that receives messages, as its object declared it.
#[derive(Clone)]
pub(crate) struct Receiver {
    pub(crate) name: &'static str,
    pub(crate) keyed: bool,
    receive: ReceiveFn,
}

impl Receiver {
    /// The receiver of tray type `R`, declared `keyed` (or not).
    pub(crate) fn of<R: Receive>(keyed: bool) -> Self {
        Self {
            name: R::NAME,
            keyed,
            receive: receive::<R>,
        }
    }
}

/// Admits one letter from `sender` into tray `R`: new (true) or a repeat
/// (false), answered once it is durable.
fn receive<R: Receive>(
    ctx: Context,
    sender: String,
    inbound: Inbound,
    keyed: bool,
) -> BoxFuture<'static, Result<bool, NotAdmitted>> {
    Box::pin(async move {
        let message: R::Message = serde_json::from_value(inbound.message).map_err(|error| {
            NotAdmitted::Refused(format!("tray {} cannot read the message: {error}", R::NAME))
        })?;
        let trays = InstanceTrays::of(ctx.slot()).ok_or(TrayError::Closed)?;
        let tray = trays.obtain::<R>(&inbound.key, keyed, true).await?;
        let window = R::SENDER_WINDOW.clamp(1, MAX_SENDER_WINDOW);
        let (admitted, receipt) = {
            let mut state = tray.state.lock();
            tray.writable(&state)?;
            let mut marks = Window::restore(state.doc.get(RECEIVED_KEY).map(|entry| entry.json()))
                .map_err(|reason| TrayError::Malformed {
                    tray: R::NAME.to_owned(),
                    key: inbound.key.clone(),
                    reason,
                })?;
            if marks.seen(&sender, inbound.seq) {
                (false, tray.frontier.receipt())
            } else {
                OpenTray::<R>::set_marked(&mut state, true);
                tray.segment(&mut state, |tray| tray.receive(message))?;
                marks.note(&sender, inbound.seq, window);
                let entry = marks.entry()?;
                state.changed |= state.doc.put(RECEIVED_KEY, entry);
                (true, tray.commit_admission(&mut state)?)
            }
        };
        if admitted {
            tray.start_pump();
        }
        receipt.await?;
        Ok(admitted)
    })
}

/// The receiving route's answer (`POST /<ns>/<id>/_pinned/messages`,
/// `MESSAGE_PATH`, mounted by the serve layer behind the request stack)
/// for an object whose trays `receivers` take messages: `caller` is the
/// request's verified attestation, `ctx` the receiving instance's.
pub(crate) async fn admit(
    receivers: Arc<[Receiver]>,
    caller: Option<&Caller>,
    ctx: &Context,
    body: Bytes,
) -> Response {
    // Only another instance sends letters: its attested name is the
    // sender, never anything the body claims.
    let Some(Caller::Instance { ns, id, .. }) = caller else {
        return detail(
            StatusCode::FORBIDDEN,
            "messages are taken from other instances only",
        );
    };
    if body.len() > MAX_MESSAGE_BYTES + 1024 {
        return detail(StatusCode::PAYLOAD_TOO_LARGE, "the letter is too large");
    }
    let inbound: Inbound = match serde_json::from_slice(&body) {
        Ok(inbound) => inbound,
        Err(error) => {
            return detail(
                StatusCode::UNPROCESSABLE_ENTITY,
                &format!("malformed letter: {error}"),
            )
        }
    };
    let Some(receiver) = receivers.iter().find(|r| r.name == inbound.tray) else {
        return detail(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!("tray {:?} does not receive messages here", inbound.tray),
        );
    };
    let key_fits = if receiver.keyed {
        !inbound.key.is_empty() && inbound.key.len() <= MAX_KEY_BYTES
    } else {
        inbound.key == SINGLETON_ID
    };
    if !key_fits || inbound.stream.is_empty() || inbound.stream.len() > 64 || inbound.seq == 0 {
        return detail(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!(
                "letter {:?}/{} to tray {}/{} does not fit its {} tray",
                inbound.stream,
                inbound.seq,
                inbound.tray,
                inbound.key,
                if receiver.keyed { "keyed" } else { "singleton" }
            ),
        );
    }
    let sender = format!("{ns}/{id}#{}", inbound.stream);
    let ctx = ctx.clone();
    let metrics = ctx.slot().host.metrics.clone();
    match (receiver.receive)(ctx, sender, inbound, receiver.keyed).await {
        Ok(admitted) => {
            metrics.tray_message("received", if admitted { "admitted" } else { "repeat" });
            let body = serde_json::json!({ "admitted": admitted }).to_string();
            ([(http::header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Err(NotAdmitted::Refused(reason)) => detail(StatusCode::UNPROCESSABLE_ENTITY, &reason),
        Err(NotAdmitted::Tray(error)) => error.into_response(),
    }
}

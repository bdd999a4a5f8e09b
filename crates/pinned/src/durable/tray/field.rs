//! The durable field kinds a [`Tray`](super::Tray) declares: [`Value`],
//! [`Queue`] and [`Outbox`], each one entry of the tray's row doc (the
//! paged [`Log`](super::Log) has a file of its own, above this one).
//!
//! A field is plain memory plus a dirty flag: mutations go through methods
//! (or `DerefMut`) that set it, so a write segment re-serializes only the
//! fields it touched. The JSON shape of each entry is the Python
//! reference's (wire.md §12.4), so either worker can read the other's rows.
//! A field never writes to the store itself; the tray's row does.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};
use std::sync::OnceLock;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value as Json;

use super::keyed::{Keyed, KeyedAdmission, ADMIT_TAG};
use super::paged::Paged;

/// A field's stored entry, encoded: the JSON text of its value. A write
/// re-encodes only the fields it touched; the row is then assembled from
/// the entries' text as it is.
#[derive(Clone)]
pub struct Entry(Box<RawValue>);

impl PartialEq for Entry {
    /// The same text: one encoder wrote both, so equal values match.
    fn eq(&self, other: &Self) -> bool {
        self.json() == other.json()
    }
}

impl Eq for Entry {}

impl Entry {
    /// `value`, encoded.
    ///
    /// # Errors
    ///
    /// `value` does not serialize to JSON (a map with non-string keys, a
    /// failing `Serialize` impl).
    pub fn of<T: Serialize + ?Sized>(value: &T) -> Result<Self, serde_json::Error> {
        serde_json::value::to_raw_value(value).map(Self)
    }

    /// JSON `null`: what a value that did not serialize leaves in place.
    pub(crate) fn null() -> Self {
        Self(RawValue::NULL.to_owned())
    }

    /// The JSON text.
    pub fn json(&self) -> &str {
        self.0.get()
    }

    pub(crate) fn raw(&self) -> &RawValue {
        &self.0
    }
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.json())
    }
}

/// Why a stored doc entry could not be restored into its field.
#[derive(Debug, thiserror::Error)]
#[error("malformed {kind} entry at {name:?}: {reason}")]
pub struct FieldError {
    /// The field kind (`value`, `queue`, `outbox`).
    pub kind: &'static str,
    /// The doc entry name.
    pub name: String,
    /// What was wrong with it.
    pub reason: String,
}

/// One durable field of a tray: how its doc entry is restored and written.
///
/// Implemented by [`Value`], [`Queue`] and [`Outbox`]; a tray lists its
/// fields in [`Tray::fields`](super::Tray::fields).
pub trait Field: Send + Sync {
    /// The field kind, for errors.
    fn kind(&self) -> &'static str;
    /// Restores the field from its stored entry (`None`: no entry, the
    /// field's initial state).
    ///
    /// # Errors
    ///
    /// The entry does not have this field's shape.
    fn restore(&mut self, entry: Option<Json>) -> Result<(), String>;
    /// The entry to store, `None` for no entry (the field's initial state
    /// occupies no storage).
    ///
    /// # Errors
    ///
    /// A value does not serialize to JSON.
    fn entry(&self) -> Result<Option<Entry>, serde_json::Error>;
    /// Whether the field changed since the last call (and resets that).
    fn take_dirty(&mut self) -> bool;
    /// Lands deferred takes ([`Queue::take`]) at a dispatch ack.
    fn commit_takes(&mut self) {}
    /// Hands deferred takes back to the front after a failed run, for its
    /// redelivery (as a restore after a crash does).
    fn return_takes(&mut self) {}
    /// The pages of a field kept in rows of their own beside the tray's row
    /// ([`Log`](super::Log)); `None` (the default) for a field kept whole in
    /// its doc entry.
    fn paged(&mut self) -> Option<&mut dyn Paged> {
        None
    }
    /// The field as a target of keyed admissions
    /// ([`TrayCtx::dispatch`](super::TrayCtx::dispatch)): a [`Queue`];
    /// `None` (the default) for kinds whose writes such an admission does
    /// not tag.
    fn keyed(&mut self) -> Option<&mut dyn Keyed> {
        None
    }
}

/// The visitor a tray lists its fields to, by doc entry name.
///
/// ```
/// # use pinned::tray::{Fields, Queue, Value};
/// # struct Jobs { queue: Queue<String>, done: Value<Vec<String>> }
/// # impl Jobs {
/// fn fields(&mut self, fields: &mut Fields<'_>) {
///     fields.field("queue", &mut self.queue);
///     fields.field("done", &mut self.done);
/// }
/// # }
/// ```
pub struct Fields<'a> {
    visit: &'a mut dyn FnMut(&'static str, &mut dyn Field),
}

impl<'a> Fields<'a> {
    pub(crate) fn new(visit: &'a mut dyn FnMut(&'static str, &mut dyn Field)) -> Self {
        Self { visit }
    }

    /// Declares field `name` (its doc entry name; it must not start with `~`
    /// and must be unique within the tray).
    pub fn field(&mut self, name: &'static str, field: &mut dyn Field) {
        (self.visit)(name, field);
    }
}

impl std::fmt::Debug for Fields<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fields").finish_non_exhaustive()
    }
}

fn decode<T: DeserializeOwned>(entry: Json) -> Result<T, String> {
    serde_json::from_value(entry).map_err(|error| error.to_string())
}

/// One durable value (the reference's `persistent(initial)`). Read it
/// through `Deref`, write it through `DerefMut` or [`set`](Self::set). A
/// value equal to its initial one occupies no storage.
#[derive(Debug, Clone)]
pub struct Value<T> {
    initial: T,
    value: T,
    dirty: bool,
}

impl<T: Clone> Value<T> {
    /// A field whose initial value is `initial`.
    pub fn new(initial: T) -> Self {
        Self {
            value: initial.clone(),
            initial,
            dirty: false,
        }
    }

    /// Replaces the value.
    pub fn set(&mut self, value: T) {
        self.value = value;
        self.dirty = true;
    }
}

impl<T: Clone + Default> Default for Value<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T> Deref for Value<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> DerefMut for Value<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.dirty = true;
        &mut self.value
    }
}

impl<T> Field for Value<T>
where
    T: Serialize + DeserializeOwned + PartialEq + Clone + Send + Sync,
{
    fn kind(&self) -> &'static str {
        "value"
    }

    fn restore(&mut self, entry: Option<Json>) -> Result<(), String> {
        self.value = match entry {
            None => self.initial.clone(),
            Some(entry) => decode(entry)?,
        };
        self.dirty = false;
        Ok(())
    }

    fn entry(&self) -> Result<Option<Entry>, serde_json::Error> {
        if self.value == self.initial {
            return Ok(None);
        }
        Entry::of(&self.value).map(Some)
    }

    fn take_dirty(&mut self) -> bool {
        std::mem::take(&mut self.dirty)
    }
}

/// A durable FIFO queue (the reference's `persistent_queue()`): append at
/// the back, peek and pop at the front. Stored as the list of items (no
/// entry when empty), or `{"items", "taken"}` while a [`take`](Self::take)
/// is pending.
///
/// An item a keyed admission ([`TrayCtx::dispatch`](super::TrayCtx::dispatch))
/// appended carries the admission's key in its stored object under
/// `"~admit"` (the reference's tag), kept beside the item in memory and
/// written back with it; such items must serialize as JSON objects.
///
/// The queue is stored whole at every change, but each item is encoded
/// only once, at the first write that stores it: its JSON text is kept
/// beside it (memory for CPU) and copied into every later write. An item
/// with interior mutability must therefore not change once queued: the
/// stored text would not follow.
#[derive(Debug, Clone)]
pub struct Queue<T> {
    items: VecDeque<Queued<T>>,
    taken: Vec<Queued<T>>,
    /// Appends since the queue was made (not durable): how a keyed
    /// admission finds the items it appended.
    pushed: u64,
    dirty: bool,
}

/// One item of a [`Queue`], with what its stored form needs. The queue
/// lends items out only shared, so the text encoded at the first write
/// stays true; without it a backlog of `n` items cost `n` serializations
/// a write (`tray-bench --jobs 40000`: half the server's CPU in string
/// escaping, 146-156 µs of it a dispatch against 98-131 with the text
/// kept).
#[derive(Debug, Clone)]
struct Queued<T> {
    item: T,
    /// The `~admit` tag a keyed admission gave the item.
    admit: Option<Json>,
    /// The untagged item's JSON text, once a write encoded it.
    text: OnceLock<Box<RawValue>>,
}

impl<T> Queued<T> {
    fn new(item: T, admit: Option<Json>) -> Self {
        Self {
            item,
            admit,
            text: OnceLock::new(),
        }
    }
}

impl<T: Serialize> Queued<T> {
    /// The item as stored: its kept text, or, with an `~admit` tag, its
    /// JSON object with the tag added (encoded each write: keyed
    /// admissions are the rare case).
    fn stored(&self) -> Result<Cow<'_, RawValue>, serde_json::Error> {
        if let Some(admit) = &self.admit {
            let mut value = serde_json::to_value(&self.item)?;
            let Json::Object(object) = &mut value else {
                return Err(serde::ser::Error::custom(
                    "an item a keyed admission appends must serialize as a JSON object",
                ));
            };
            object.insert(ADMIT_TAG.to_owned(), admit.clone());
            return serde_json::value::to_raw_value(&value).map(Cow::Owned);
        }
        if let Some(text) = self.text.get() {
            return Ok(Cow::Borrowed(text));
        }
        let text = serde_json::value::to_raw_value(&self.item)?;
        Ok(Cow::Borrowed(self.text.get_or_init(|| text)))
    }
}

/// `items` as stored, in order.
fn stored<'a, T: Serialize + 'a>(
    items: impl Iterator<Item = &'a Queued<T>>,
) -> Result<Vec<Cow<'a, RawValue>>, serde_json::Error> {
    items.map(Queued::stored).collect()
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Self {
            items: VecDeque::new(),
            taken: Vec::new(),
            pushed: 0,
            dirty: false,
        }
    }
}

impl<T> Queue<T> {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `item` at the back.
    pub fn push_back(&mut self, item: T) {
        self.items.push_back(Queued::new(item, None));
        self.pushed += 1;
        self.dirty = true;
    }

    /// The item at the front.
    pub fn front(&self) -> Option<&T> {
        self.items.front().map(|queued| &queued.item)
    }

    /// Removes and returns the item at the front.
    pub fn pop_front(&mut self) -> Option<T> {
        let item = self.items.pop_front().map(|queued| queued.item);
        self.dirty |= item.is_some();
        item
    }

    /// Moves up to `count` items from the front into the pending takes and
    /// returns clones of them. The takes land durably with the current
    /// dispatch's ack; if it never acks (a crash, an error), they are back at
    /// the front on redelivery. For handlers that work through a batch.
    pub fn take(&mut self, count: usize) -> Vec<T>
    where
        T: Clone,
    {
        let count = count.min(self.items.len());
        let at = self.taken.len();
        self.taken.extend(self.items.drain(..count));
        self.dirty |= count > 0;
        self.taken[at..]
            .iter()
            .map(|queued| queued.item.clone())
            .collect()
    }

    /// Moves the newest `count` pending takes (all of them when fewer)
    /// back to the front, in their order; answers how many moved. For a
    /// handler that took more than it used (the reference's `untake`).
    pub fn untake(&mut self, count: usize) -> usize {
        let count = count.min(self.taken.len());
        let at = self.taken.len() - count;
        for queued in self.taken.drain(at..).rev() {
            self.items.push_front(queued);
        }
        self.dirty |= count > 0;
        count
    }

    /// The number of queued items (pending takes excluded).
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether no item is queued.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The queued items, front first.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.items.iter().map(|queued| &queued.item)
    }
}

impl<T> Field for Queue<T>
where
    T: Serialize + DeserializeOwned + Clone + Send + Sync,
{
    fn kind(&self) -> &'static str {
        "queue"
    }

    fn restore(&mut self, entry: Option<Json>) -> Result<(), String> {
        type Tagged<T> = Vec<(T, Option<Json>)>;
        let (taken, items): (Tagged<T>, Tagged<T>) = match entry {
            None => (Vec::new(), Vec::new()),
            Some(Json::Array(items)) => (Vec::new(), untagged(Json::Array(items))?),
            Some(Json::Object(mut entry)) => {
                if entry.keys().any(|key| key != "items" && key != "taken") {
                    return Err("only \"items\" and \"taken\" may appear".to_owned());
                }
                let mut list = |key: &str| -> Result<Tagged<T>, String> {
                    match entry.remove(key) {
                        None => Ok(Vec::new()),
                        Some(list @ Json::Array(_)) => untagged(list),
                        Some(_) => Err(format!("{key:?} must be a list")),
                    }
                };
                (list("taken")?, list("items")?)
            }
            Some(_) => return Err("expected a list or an object".to_owned()),
        };
        // Takes left by a dispatch that never acked are back at the front,
        // and the rewritten entry says so at the next write.
        self.dirty = !taken.is_empty();
        self.items = taken
            .into_iter()
            .chain(items)
            .map(|(item, admit)| Queued::new(item, admit))
            .collect();
        self.taken.clear();
        Ok(())
    }

    fn entry(&self) -> Result<Option<Entry>, serde_json::Error> {
        if self.taken.is_empty() {
            if self.items.is_empty() {
                return Ok(None);
            }
            return Entry::of(&stored(self.items.iter())?).map(Some);
        }
        /// The entry while takes are pending.
        #[derive(Serialize)]
        struct Pending<'a> {
            #[serde(skip_serializing_if = "Vec::is_empty")]
            items: Vec<Cow<'a, RawValue>>,
            taken: Vec<Cow<'a, RawValue>>,
        }
        Entry::of(&Pending {
            items: stored(self.items.iter())?,
            taken: stored(self.taken.iter())?,
        })
        .map(Some)
    }

    fn take_dirty(&mut self) -> bool {
        std::mem::take(&mut self.dirty)
    }

    fn commit_takes(&mut self) {
        if !self.taken.is_empty() {
            self.taken.clear();
            self.dirty = true;
        }
    }

    fn return_takes(&mut self) {
        let _moved = self.untake(self.taken.len());
    }

    fn keyed(&mut self) -> Option<&mut dyn Keyed> {
        Some(self)
    }
}

impl<T: Send + Sync> Keyed for Queue<T> {
    fn appended(&self) -> u64 {
        self.pushed
    }

    fn admit_appended(&mut self, since: u64, admission: &mut KeyedAdmission<'_>) {
        let count = usize::try_from(self.pushed.saturating_sub(since))
            .unwrap_or(usize::MAX)
            .min(self.items.len());
        if count == 0 {
            return;
        }
        let first = self.items.len() - count;
        // The reference's budget: entries already tagged with the key absorb
        // as many appends of a re-run admission.
        let mut budget = self
            .taken
            .iter()
            .chain(self.items.iter().take(first))
            .filter(|queued| queued.admit.as_ref() == Some(admission.key))
            .count();
        let mut index = first;
        for _ in 0..count {
            admission.attempted += 1;
            if admission.ignored || budget > 0 {
                budget = budget.saturating_sub(1);
                self.items.remove(index);
                continue;
            }
            admission.landed += 1;
            self.items[index].admit = Some(admission.key.clone());
            index += 1;
        }
        self.dirty = true;
    }
}

/// Decodes stored queue items, splitting off their `~admit` tags.
fn untagged<T: DeserializeOwned>(list: Json) -> Result<Vec<(T, Option<Json>)>, String> {
    let Json::Array(list) = list else {
        return Err("expected a list".to_owned());
    };
    list.into_iter()
        .map(|mut item| {
            let admit = match &mut item {
                Json::Object(object) => object.remove(ADMIT_TAG),
                _ => None,
            };
            Ok((decode(item)?, admit))
        })
        .collect()
}

/// The one item a handler has in flight toward somewhere else, with its
/// attempt count (the reference's `persistent_outbox()`): `dispatch(item)`
/// records it (the same item again bumps the attempt), `ack()` clears it.
/// Stored as `{"item", "attempt"}`, no entry when empty.
#[derive(Debug, Clone)]
pub struct Outbox<T> {
    slot: Option<(T, u64)>,
    dirty: bool,
}

impl<T> Default for Outbox<T> {
    fn default() -> Self {
        Self {
            slot: None,
            dirty: false,
        }
    }
}

impl<T: PartialEq> Outbox<T> {
    /// Records `item` as in flight and returns its attempt: 1 for a new
    /// item, one more than before for the item already there.
    pub fn dispatch(&mut self, item: T) -> u64 {
        let attempt = match &self.slot {
            Some((current, attempt)) if *current == item => attempt + 1,
            _ => 1,
        };
        self.slot = Some((item, attempt));
        self.dirty = true;
        attempt
    }

    /// Clears the item in flight; false when there was none.
    pub fn ack(&mut self) -> bool {
        let had = self.slot.take().is_some();
        self.dirty |= had;
        had
    }

    /// The item in flight.
    pub fn item(&self) -> Option<&T> {
        self.slot.as_ref().map(|(item, _)| item)
    }

    /// The attempt of the item in flight, 0 when empty.
    pub fn attempt(&self) -> u64 {
        self.slot.as_ref().map_or(0, |(_, attempt)| *attempt)
    }
}

impl<T> Field for Outbox<T>
where
    T: Serialize + DeserializeOwned + PartialEq + Send + Sync,
{
    fn kind(&self) -> &'static str {
        "outbox"
    }

    fn restore(&mut self, entry: Option<Json>) -> Result<(), String> {
        self.slot = match entry {
            None => None,
            Some(Json::Object(mut entry)) => {
                if entry.len() != 2 {
                    return Err("expected exactly \"item\" and \"attempt\"".to_owned());
                }
                let attempt = entry
                    .remove("attempt")
                    .and_then(|attempt| attempt.as_u64())
                    .filter(|attempt| *attempt >= 1)
                    .ok_or("\"attempt\" must be an integer of at least 1")?;
                let item = entry.remove("item").ok_or("\"item\" is missing")?;
                Some((decode(item)?, attempt))
            }
            Some(_) => return Err("expected an object".to_owned()),
        };
        self.dirty = false;
        Ok(())
    }

    fn entry(&self) -> Result<Option<Entry>, serde_json::Error> {
        let Some((item, attempt)) = &self.slot else {
            return Ok(None);
        };
        /// The entry of the item in flight.
        #[derive(Serialize)]
        struct InFlight<'a, T> {
            attempt: u64,
            item: &'a T,
        }
        Entry::of(&InFlight {
            attempt: *attempt,
            item,
        })
        .map(Some)
    }

    fn take_dirty(&mut self) -> bool {
        std::mem::take(&mut self.dirty)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may panic on the unexpected
mod tests {
    use super::*;
    use serde_json::json;

    /// An entry's text, decoded.
    fn decoded(entry: Option<Entry>) -> Option<Json> {
        entry.map(|entry| serde_json::from_str(entry.json()).unwrap())
    }

    #[test]
    fn a_value_at_its_initial_occupies_no_entry() {
        let mut done: Value<Vec<String>> = Value::default();
        assert_eq!(done.entry().unwrap(), None);
        done.push("a".into());
        assert!(done.take_dirty());
        assert_eq!(decoded(done.entry().unwrap()), Some(json!(["a"])));
        done.restore(None).unwrap();
        assert!(done.is_empty());
    }

    #[test]
    fn a_queue_with_pending_takes_stores_both_lists_and_restores_takes_first() {
        let mut queue: Queue<u32> = Queue::new();
        for n in 1..=3 {
            queue.push_back(n);
        }
        assert_eq!(queue.take(1), vec![1]);
        let entry = decoded(queue.entry().unwrap()).unwrap();
        assert_eq!(entry, json!({"taken": [1], "items": [2, 3]}));
        let mut restored: Queue<u32> = Queue::new();
        restored.restore(Some(entry)).unwrap();
        assert_eq!(restored.iter().copied().collect::<Vec<_>>(), vec![1, 2, 3]);
        assert!(restored.take_dirty(), "the restored takes are rewritten");
        queue.commit_takes();
        assert_eq!(decoded(queue.entry().unwrap()), Some(json!([2, 3])));
    }

    #[test]
    fn untake_moves_the_newest_takes_back_to_the_front_in_order() {
        let mut queue: Queue<u32> = Queue::new();
        for n in 1..=4 {
            queue.push_back(n);
        }
        assert_eq!(queue.take(3), [1, 2, 3]);
        assert_eq!(queue.untake(2), 2);
        assert_eq!(queue.iter().copied().collect::<Vec<_>>(), [2, 3, 4]);
        assert_eq!(
            decoded(queue.entry().unwrap()),
            Some(json!({"taken": [1], "items": [2, 3, 4]}))
        );
        assert_eq!(queue.untake(5), 1, "only what is taken moves");
        assert_eq!(decoded(queue.entry().unwrap()), Some(json!([1, 2, 3, 4])));
    }

    /// An item that counts its encodings.
    #[derive(Clone, Debug, serde::Deserialize)]
    struct Counted(u32);

    static ENCODINGS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    impl Serialize for Counted {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            ENCODINGS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            serializer.serialize_u32(self.0)
        }
    }

    #[test]
    fn a_queued_item_is_encoded_once_however_often_the_queue_is_written() {
        let mut queue: Queue<Counted> = Queue::new();
        queue.push_back(Counted(1));
        queue.push_back(Counted(2));
        assert_eq!(decoded(queue.entry().unwrap()), Some(json!([1, 2])));
        queue.push_back(Counted(3));
        assert_eq!(decoded(queue.entry().unwrap()), Some(json!([1, 2, 3])));
        assert_eq!(queue.take(1).len(), 1);
        assert_eq!(
            decoded(queue.entry().unwrap()),
            Some(json!({"taken": [1], "items": [2, 3]}))
        );
        queue.return_takes();
        queue.pop_front();
        assert_eq!(decoded(queue.entry().unwrap()), Some(json!([2, 3])));
        assert_eq!(
            ENCODINGS.load(std::sync::atomic::Ordering::Relaxed),
            3,
            "each item once, at the first write that stored it"
        );
    }

    #[test]
    fn a_malformed_queue_entry_is_refused() {
        let mut queue: Queue<u32> = Queue::new();
        assert!(queue.restore(Some(json!({"items": [1], "x": 1}))).is_err());
        assert!(queue.restore(Some(json!("nope"))).is_err());
        assert!(queue.restore(Some(json!(["not a number"]))).is_err());
    }

    #[test]
    fn an_outbox_counts_attempts_of_the_same_item() {
        let mut outbox: Outbox<String> = Outbox::default();
        assert_eq!(outbox.dispatch("a".into()), 1);
        assert_eq!(outbox.dispatch("a".into()), 2);
        assert_eq!(
            decoded(outbox.entry().unwrap()),
            Some(json!({"item": "a", "attempt": 2}))
        );
        assert_eq!(outbox.dispatch("b".into()), 1);
        assert!(outbox.ack());
        assert_eq!(outbox.entry().unwrap(), None);
        assert!(outbox
            .restore(Some(json!({"item": "a", "attempt": 0})))
            .is_err());
    }

    #[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
    struct Item {
        n: u32,
    }

    /// Pushes `ns` under a keyed admission of `key`; answers its tally.
    fn admit(queue: &mut Queue<Item>, key: &Json, ignored: bool, ns: &[u32]) -> (u64, u64) {
        let since = Keyed::appended(queue);
        for &n in ns {
            queue.push_back(Item { n });
        }
        let mut admission = KeyedAdmission::new(key, ignored);
        queue.admit_appended(since, &mut admission);
        (admission.attempted, admission.landed)
    }

    #[test]
    fn a_keyed_admission_tags_its_appends_as_the_reference_and_a_re_run_is_absorbed() {
        let key = json!(["r", 1]);
        let mut queue: Queue<Item> = Queue::new();
        queue.push_back(Item { n: 0 });
        assert_eq!(admit(&mut queue, &key, false, &[1]), (1, 1));
        assert_eq!(
            decoded(queue.entry().unwrap()),
            Some(json!([{"n": 0}, {"n": 1, "~admit": ["r", 1]}]))
        );
        // A re-run: the tagged entry present absorbs the append.
        assert_eq!(admit(&mut queue, &key, false, &[1]), (1, 0));
        assert_eq!(queue.len(), 2);
        // Restored, the tag is kept beside the item and written back; a take
        // keeps it in the pending takes.
        let stored = decoded(queue.entry().unwrap());
        let mut restored: Queue<Item> = Queue::new();
        restored.restore(stored.clone()).unwrap();
        assert_eq!(
            restored.iter().cloned().collect::<Vec<_>>(),
            [Item { n: 0 }, Item { n: 1 }]
        );
        assert_eq!(decoded(restored.entry().unwrap()), stored);
        assert_eq!(restored.take(2).len(), 2);
        assert_eq!(
            decoded(restored.entry().unwrap()),
            Some(json!({"taken": [{"n": 0}, {"n": 1, "~admit": ["r", 1]}]}))
        );
        assert_eq!(
            admit(&mut restored, &key, false, &[1]),
            (1, 0),
            "taken entries count"
        );
        // A target that holds the key absorbs every append.
        assert_eq!(
            admit(&mut restored, &json!(["r", 2]), true, &[2, 3]),
            (2, 0)
        );
        assert_eq!(restored.len(), 0);
    }

    #[test]
    fn a_tagged_item_that_is_not_an_object_does_not_encode() {
        let mut queue: Queue<u32> = Queue::new();
        let since = Keyed::appended(&queue);
        queue.push_back(7);
        let key = json!("k");
        queue.admit_appended(since, &mut KeyedAdmission::new(&key, false));
        assert!(queue.entry().is_err());
    }
}

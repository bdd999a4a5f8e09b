//! [`Log`]: the append-only field kind, whose entries live in page rows of
//! bounded size beside the tray's row, so that an append writes only the
//! newest page and the tray's row holds only where the pages are.
//!
//! A log numbers its entries from 0 (an entry's *position*, never reused)
//! and cuts them into pages of a fixed number of entries: page `p` holds
//! positions `p * page_len ..`. The field keeps in memory only its newest,
//! not yet full page (read back when the tray opens); older pages no
//! longer change until a trim deletes them, and reads fetch them from the
//! store ([`LogRead`]). It never writes a row itself: the tray enlists the
//! page images it hands over together with the tray's row, in one batch.

use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;

use pinned_store::{Doc, DocText};
use serde::de::{DeserializeOwned, Error as _};
use serde::Deserialize;
use serde::Serialize;
use serde_json::value::{to_raw_value, RawValue};
use serde_json::Value as Json;

use super::field::{Entry, Field};
use super::paged::{PageSource, PageWrite, Paged};
use super::TrayError;

/// An append-only log of `T`, a tray field kind of this library's own (the
/// Python reference has none). Append with [`append`](Self::append), read
/// with [`latest`](Self::latest) or [`from`](Self::from) (awaited: older
/// pages come from the store), drop old entries with
/// [`keep_last`](Self::keep_last) or [`trim_before`](Self::trim_before).
///
/// An append costs the same however long the log is: the write carries the
/// newest page (at most [`page_len`](Self::page_len) entries) and a few
/// numbers in the tray's row, never the older entries. Appends and trims
/// land in the row write of the segment that made them (with an
/// admission, with an ack), so they are as durable, ordered and
/// exactly-once as the tray's other fields.
///
/// ```
/// use pinned::tray::Log;
///
/// let mut history: Log<String> = Log::with_page_len(4);
/// for turn in ["hi", "hello", "how are you?", "fine", "bye"] {
///     history.append(turn.to_owned());
/// }
/// assert_eq!((history.start(), history.end(), history.len()), (0, 5, 5));
/// history.keep_last(2);
/// assert_eq!((history.start(), history.len()), (3, 2));
/// ```
pub struct Log<T> {
    page_len: u64,
    /// The first position kept (trims move it up).
    start: u64,
    /// The position the next append takes.
    next: u64,
    /// The position of `tail[0]`, the first of a page.
    tail_first: u64,
    /// The entries `tail_first..next`: the newest page, and the pages an
    /// append filled since the last write.
    tail: Vec<Entry>,
    /// The newest page is in `tail` (false between a restore and its
    /// page's read-back).
    loaded: bool,
    /// The first page appended to since the last write.
    touched: Option<u64>,
    /// Pages to delete with the next write.
    deletes: Option<Range<u64>>,
    /// Why an append cannot be written (a value that did not serialize).
    failure: Option<String>,
    dirty: bool,
    source: Option<Arc<dyn PageSource>>,
    entries: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for Log<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log")
            .field("start", &self.start)
            .field("end", &self.next)
            .field("page_len", &self.page_len)
            .finish_non_exhaustive()
    }
}

impl<T> Default for Log<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// The doc entry of a log in the tray's row: where its pages are.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Where {
    start: u64,
    next: u64,
    page: u64,
}

impl<T> Log<T> {
    /// Entries per page of [`Log::new`]: with entries of 1 KB, pages of
    /// about 16 KB.
    pub const DEFAULT_PAGE_LEN: u32 = 16;
    /// The most entries a page may hold.
    pub const MAX_PAGE_LEN: u32 = 4096;

    /// An empty log of pages of [`DEFAULT_PAGE_LEN`](Self::DEFAULT_PAGE_LEN)
    /// entries.
    pub fn new() -> Self {
        Self::with_page_len(Self::DEFAULT_PAGE_LEN)
    }

    /// An empty log of pages of `page_len` entries (at least 1, at most
    /// [`MAX_PAGE_LEN`](Self::MAX_PAGE_LEN)). It applies to a log that was
    /// never written: a stored log keeps the page length it was written
    /// with. Longer pages make reads of many entries take fewer store
    /// reads; each append rewrites its page, on average half of one.
    pub fn with_page_len(page_len: u32) -> Self {
        Self {
            page_len: u64::from(page_len.clamp(1, Self::MAX_PAGE_LEN)),
            start: 0,
            next: 0,
            tail_first: 0,
            tail: Vec::new(),
            loaded: true,
            touched: None,
            deletes: None,
            failure: None,
            dirty: false,
            source: None,
            entries: PhantomData,
        }
    }

    /// The position of the first entry kept (0 until a trim).
    pub fn start(&self) -> u64 {
        self.start
    }

    /// The position the next append takes: the number of entries ever
    /// appended.
    pub fn end(&self) -> u64 {
        self.next
    }

    /// The number of entries kept (`end - start`).
    pub fn len(&self) -> u64 {
        self.next - self.start
    }

    /// Whether no entry is kept.
    pub fn is_empty(&self) -> bool {
        self.next == self.start
    }

    /// Entries per page.
    pub fn page_len(&self) -> u32 {
        // At most MAX_PAGE_LEN, set from a u32 or checked at restore.
        u32::try_from(self.page_len).unwrap_or(Self::MAX_PAGE_LEN)
    }

    /// Drops the entries before `position` (positions stay: the next
    /// append still takes [`end`](Self::end)). Their pages are deleted with
    /// the write, all but the one `position` falls in.
    pub fn trim_before(&mut self, position: u64) {
        let start = position.clamp(self.start, self.next);
        if start == self.start {
            return;
        }
        let (from, to) = (self.start / self.page_len, start / self.page_len);
        if from < to {
            self.delete_pages(from..to);
        }
        self.start = start;
        self.dirty = true;
    }

    /// Keeps only the last `count` entries.
    pub fn keep_last(&mut self, count: u64) {
        self.trim_before(self.next.saturating_sub(count));
    }

    fn delete_pages(&mut self, pages: Range<u64>) {
        self.deletes = Some(match self.deletes.take() {
            Some(deletes) => deletes.start.min(pages.start)..deletes.end.max(pages.end),
            None => pages,
        });
    }

    /// The read of positions `from..to` (both within the log).
    fn read(&self, from: u64, to: u64) -> LogRead<T> {
        let held = from.max(self.tail_first);
        let memory = if held < to {
            // In memory: `tail` covers `tail_first..next` and `to <= next`.
            let at = |position: u64| usize::try_from(position - self.tail_first).unwrap_or(0);
            self.tail[at(held)..at(to)].to_vec()
        } else {
            Vec::new()
        };
        LogRead {
            source: self.source.clone(),
            page_len: self.page_len,
            from,
            stored: from..to.min(self.tail_first).max(from),
            memory,
            unloaded: !self.loaded && to > self.tail_first,
            entries: PhantomData,
        }
    }

    /// The last `count` entries kept (fewer when the log holds fewer).
    pub fn latest(&self, count: u64) -> LogRead<T> {
        let from = self.next.saturating_sub(count).max(self.start);
        self.read(from, self.next)
    }

    /// Up to `limit` entries from `position` on (from
    /// [`start`](Self::start) when `position` was trimmed away; none when
    /// it is at or past [`end`](Self::end)). For a reader that keeps its
    /// place: the next read starts at the answer's
    /// [`end`](LogSlice::end).
    pub fn from(&self, position: u64, limit: u64) -> LogRead<T> {
        let from = position.clamp(self.start, self.next);
        self.read(from, from.saturating_add(limit).min(self.next))
    }

    /// The image of page `page` from `tail`.
    fn image(&self, page: u64) -> Result<DocText, serde_json::Error> {
        let first = page * self.page_len;
        let end = (first + self.page_len).min(self.next);
        let at = |position: u64| usize::try_from(position - self.tail_first).unwrap_or(0);
        let entries = &self.tail[at(first)..at(end)];
        let mut list =
            String::with_capacity(2 + entries.iter().map(|e| e.json().len() + 1).sum::<usize>());
        list.push('[');
        for (n, entry) in entries.iter().enumerate() {
            if n > 0 {
                list.push(',');
            }
            list.push_str(entry.json());
        }
        list.push(']');
        let list = RawValue::from_string(list)?;
        let first = to_raw_value(&first)?;
        Ok(DocText::from_entries([
            ("entries", list.as_ref()),
            ("first", first.as_ref()),
        ]))
    }
}

impl<T: Serialize> Log<T> {
    /// Appends `entry` and returns its position. It lands with the write
    /// of the segment it is in; a value that does not serialize fails that
    /// write (and aborts the instance, as for any field).
    pub fn append(&mut self, entry: T) -> u64 {
        let position = self.next;
        let encoded = match Entry::of(&entry) {
            Ok(encoded) => encoded,
            Err(error) => {
                self.failure.get_or_insert(error.to_string());
                Entry::null()
            }
        };
        if !self.loaded {
            self.failure
                .get_or_insert("an append before the log's newest page was read back".to_owned());
        }
        self.tail.push(encoded);
        let page = position / self.page_len;
        self.touched = Some(self.touched.map_or(page, |touched| touched.min(page)));
        self.next += 1;
        self.dirty = true;
        position
    }

    /// Appends every entry of `entries`, in order.
    pub fn extend(&mut self, entries: impl IntoIterator<Item = T>) {
        for entry in entries {
            self.append(entry);
        }
    }
}

impl<T> Field for Log<T>
where
    T: Serialize + DeserializeOwned + Send + Sync,
{
    fn kind(&self) -> &'static str {
        "log"
    }

    fn restore(&mut self, entry: Option<Json>) -> Result<(), String> {
        let (start, next, page_len) = match entry {
            None => (0, 0, self.page_len),
            Some(entry) => {
                let Where { start, next, page } =
                    serde_json::from_value(entry).map_err(|error| error.to_string())?;
                if page == 0 || page > u64::from(Self::MAX_PAGE_LEN) || start > next {
                    return Err(format!(
                        "start {start}, next {next}, page {page} do not describe a log"
                    ));
                }
                (start, next, page)
            }
        };
        self.page_len = page_len;
        self.start = start;
        self.next = next;
        self.tail_first = next - next % page_len;
        self.tail = Vec::new();
        self.loaded = next == self.tail_first;
        self.touched = None;
        self.deletes = None;
        self.failure = None;
        self.dirty = false;
        Ok(())
    }

    fn entry(&self) -> Result<Option<Entry>, serde_json::Error> {
        if let Some(failure) = &self.failure {
            return Err(serde_json::Error::custom(failure));
        }
        if self.next == 0 {
            return Ok(None);
        }
        Entry::of(&Where {
            start: self.start,
            next: self.next,
            page: self.page_len,
        })
        .map(Some)
    }

    fn take_dirty(&mut self) -> bool {
        std::mem::take(&mut self.dirty)
    }

    fn paged(&mut self) -> Option<&mut dyn Paged> {
        Some(self)
    }
}

impl<T> Paged for Log<T>
where
    T: Serialize + DeserializeOwned + Send + Sync,
{
    fn page_to_load(&self) -> Option<u64> {
        (!self.loaded).then_some(self.tail_first / self.page_len)
    }

    fn load(&mut self, page: Option<&Doc>) -> Result<(), String> {
        let number = self.tail_first / self.page_len;
        let held = usize::try_from(self.next - self.tail_first).unwrap_or(usize::MAX);
        let entries = page
            .ok_or_else(|| format!("page {number} is missing"))?
            .get("entries")
            .and_then(Json::as_array)
            .ok_or_else(|| format!("page {number} has no list of entries"))?;
        // A page never holds less than the row that names it says: both
        // land in one write.
        let entries = entries
            .get(..held)
            .ok_or_else(|| format!("page {number} holds {} entries, not {held}", entries.len()))?;
        self.tail = entries
            .iter()
            .map(Entry::of)
            .collect::<Result<_, _>>()
            .map_err(|error| error.to_string())?;
        self.loaded = true;
        Ok(())
    }

    fn take_writes(&mut self, writes: &mut Vec<PageWrite>) -> Result<(), serde_json::Error> {
        if let Some(failure) = &self.failure {
            return Err(serde_json::Error::custom(failure));
        }
        if let Some(deletes) = self.deletes.take() {
            writes.extend(deletes.map(|page| (page, None)));
        }
        if let Some(touched) = self.touched.take() {
            // Pages trimmed away in the same segment are not written.
            let first = touched.max(self.start / self.page_len);
            if self.next > 0 {
                for page in first..=(self.next - 1) / self.page_len {
                    writes.push((page, Some(self.image(page)?)));
                }
            }
        }
        // Only the newest page stays in memory.
        let open = self.next - self.next % self.page_len;
        let sealed = usize::try_from(open - self.tail_first).unwrap_or(0);
        self.tail.drain(..sealed.min(self.tail.len()));
        self.tail_first = open;
        Ok(())
    }

    fn pages(&self) -> Range<u64> {
        if self.next == 0 {
            return 0..0;
        }
        self.start / self.page_len..(self.next - 1) / self.page_len + 1
    }

    fn discard(&mut self, entry: Option<&Json>) {
        let Some(Ok(Where { start, next, page })) = entry.map(Where::deserialize) else {
            return;
        };
        if page > 0 && next > start {
            self.delete_pages(start / page..(next - 1) / page + 1);
            self.dirty = true;
        }
    }

    fn bind(&mut self, source: Arc<dyn PageSource>) {
        self.source = Some(source);
    }
}

/// Entries of a [`Log`] from position [`first`](Self::first) on, in order
/// (as JSON: `{"first": …, "entries": […]}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LogSlice<T> {
    /// The position of `entries[0]` (of where they would start when there
    /// are none).
    pub first: u64,
    /// The entries.
    pub entries: Vec<T>,
}

impl<T> LogSlice<T> {
    /// The position after the last entry: where a reader that keeps its
    /// place reads on.
    pub fn end(&self) -> u64 {
        self.first + self.entries.len() as u64
    }
}

/// A read of a [`Log`], taken under the tray's lock by
/// [`Log::latest`] or [`Log::from`] and awaited outside it: the entries
/// in memory are copied at once, older pages come from the store (every
/// write the instance enlisted before lands first, so a read sees its own
/// appends). Entries a trim removes meanwhile are left out of the answer.
///
/// ```
/// # use pinned::tray::{Fields, Log, Queue, Tray, TrayError, TrayHandle};
/// # #[derive(Default)]
/// # struct Session { inbox: Queue<String>, history: Log<String> }
/// # impl Tray for Session {
/// #     const NAME: &'static str = "session";
/// #     type Item = String;
/// #     fn fields(&mut self, f: &mut Fields<'_>) {
/// #         f.field("inbox", &mut self.inbox);
/// #         f.field("history", &mut self.history);
/// #     }
/// #     fn head(&self) -> Option<String> { self.inbox.front().cloned() }
/// #     fn ack(&mut self, _: &String) { self.inbox.pop_front(); }
/// # }
/// # async fn demo(session: TrayHandle<Session>) -> Result<(), TrayError> {
/// let last = session.read(|s| s.history.latest(20)).await?;
/// for (position, turn) in (last.first..).zip(&last.entries) {
///     println!("{position}: {turn}");
/// }
/// # Ok(())
/// # }
/// ```
#[must_use = "a log read does nothing unless awaited"]
pub struct LogRead<T> {
    source: Option<Arc<dyn PageSource>>,
    page_len: u64,
    from: u64,
    /// The positions to read from page rows.
    stored: Range<u64>,
    /// The entries after those, copied from memory.
    memory: Vec<Entry>,
    unloaded: bool,
    entries: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for LogRead<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogRead")
            .field("from", &self.from)
            .field("stored", &self.stored)
            .field("in_memory", &self.memory.len())
            .finish_non_exhaustive()
    }
}

impl<T: DeserializeOwned + Send + 'static> IntoFuture for LogRead<T> {
    type Output = Result<LogSlice<T>, TrayError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.run())
    }
}

impl<T: DeserializeOwned + Send + 'static> LogRead<T> {
    async fn run(self) -> Result<LogSlice<T>, TrayError> {
        let malformed = |reason: String| match &self.source {
            Some(source) => source.malformed(reason),
            None => TrayError::Encode(reason),
        };
        if self.unloaded {
            return Err(malformed(
                "the log's newest page is not read back yet".to_owned(),
            ));
        }
        let capacity = usize::try_from(self.stored.end - self.stored.start)
            .unwrap_or(0)
            .saturating_add(self.memory.len())
            .min(4096);
        let mut slice = LogSlice {
            first: self.from,
            entries: Vec::with_capacity(capacity),
        };
        if !self.stored.is_empty() {
            let source = self.source.clone().ok_or(TrayError::Closed)?;
            let (from, to) = (self.stored.start, self.stored.end);
            for page in from / self.page_len..=(to - 1) / self.page_len {
                let first = page * self.page_len;
                let Some(doc) = source.clone().read(page).await? else {
                    // Trimmed since the read was taken: what is left
                    // starts after it.
                    slice.entries.clear();
                    slice.first = first + self.page_len;
                    continue;
                };
                let entries = doc
                    .get("entries")
                    .and_then(Json::as_array)
                    .ok_or_else(|| malformed(format!("log page {page} has no list of entries")))?;
                for position in from.max(first)..to.min(first + self.page_len) {
                    let at = usize::try_from(position - first).unwrap_or(usize::MAX);
                    let entry = entries.get(at).ok_or_else(|| {
                        malformed(format!("log page {page} has no entry {position}"))
                    })?;
                    slice
                        .entries
                        .push(T::deserialize(entry).map_err(|error| {
                            malformed(format!("log entry {position}: {error}"))
                        })?);
                }
            }
        }
        for (n, entry) in self.memory.iter().enumerate() {
            slice
                .entries
                .push(serde_json::from_str(entry.json()).map_err(|error| {
                    malformed(format!("log entry {}: {error}", self.stored.end + n as u64))
                })?);
        }
        Ok(slice)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may panic on the unexpected
mod tests {
    use super::*;
    use serde_json::json;

    fn written(log: &mut Log<u32>) -> Vec<(u64, Option<Json>)> {
        let mut writes = Vec::new();
        log.take_writes(&mut writes).unwrap();
        writes
            .into_iter()
            .map(|(page, image)| {
                (
                    page,
                    image.map(|image| serde_json::from_str(image.as_str()).unwrap()),
                )
            })
            .collect()
    }

    #[test]
    fn an_append_writes_only_its_page_and_the_entry_says_where_the_pages_are() {
        let mut log: Log<u32> = Log::with_page_len(3);
        assert_eq!(log.entry().unwrap(), None, "an empty log occupies no entry");
        for n in 0..4 {
            log.append(n);
        }
        assert!(log.take_dirty());
        assert_eq!(
            written(&mut log),
            vec![
                (0, Some(json!({"first": 0, "entries": [0, 1, 2]}))),
                (1, Some(json!({"first": 3, "entries": [3]}))),
            ]
        );
        assert_eq!(log.tail.len(), 1, "only the newest page stays in memory");
        log.append(4);
        assert_eq!(
            written(&mut log),
            vec![(1, Some(json!({"first": 3, "entries": [3, 4]})))]
        );
        let entry: Json = serde_json::from_str(log.entry().unwrap().unwrap().json()).unwrap();
        assert_eq!(entry, json!({"start": 0, "next": 5, "page": 3}));
    }

    #[test]
    fn a_trim_deletes_the_pages_wholly_before_it_and_never_writes_them() {
        let mut log: Log<u32> = Log::with_page_len(2);
        log.extend(0..5);
        let _ = written(&mut log);
        log.trim_before(3);
        assert_eq!((log.start(), log.len()), (3, 2));
        assert_eq!(written(&mut log), vec![(0, None)]);
        assert_eq!(log.pages(), 1..3);
        log.extend(5..9);
        log.keep_last(1);
        assert_eq!(
            written(&mut log),
            vec![
                (1, None),
                (2, None),
                (3, None),
                (4, Some(json!({"first": 8, "entries": [8]}))),
            ]
        );
        log.trim_before(100);
        assert!(log.is_empty());
        assert_eq!(log.end(), 9, "positions are never reused");
    }

    #[test]
    fn a_restored_log_reads_its_newest_page_back_before_it_appends() {
        let mut log: Log<u32> = Log::with_page_len(8);
        log.restore(Some(json!({"start": 1, "next": 6, "page": 4})))
            .unwrap();
        assert_eq!(log.page_len(), 4, "the stored page length wins");
        assert_eq!(log.page_to_load(), Some(1));
        let page = json!({"first": 4, "entries": [4, 5, 6]});
        log.load(page.as_object()).unwrap();
        assert_eq!(
            log.tail.len(),
            2,
            "an entry past the row's count is not the log's"
        );
        log.append(6);
        assert_eq!(
            written(&mut log),
            vec![(1, Some(json!({"first": 4, "entries": [4, 5, 6]})))]
        );
        let mut short: Log<u32> = Log::new();
        short
            .restore(Some(json!({"start": 0, "next": 3, "page": 4})))
            .unwrap();
        assert!(short.load(json!({"entries": [0]}).as_object()).is_err());
        assert!(short.load(None).is_err());
        assert!(short
            .restore(Some(json!({"start": 4, "next": 3, "page": 4})))
            .is_err());
        assert!(short
            .restore(Some(json!({"start": 0, "next": 3, "page": 0})))
            .is_err());
    }

    #[test]
    fn an_append_before_the_read_back_fails_its_write() {
        let mut log: Log<u32> = Log::new();
        log.restore(Some(json!({"start": 0, "next": 3, "page": 4})))
            .unwrap();
        log.append(3);
        assert!(log.entry().is_err());
        assert!(log.take_writes(&mut Vec::new()).is_err());
    }

    #[test]
    fn a_discarded_entry_deletes_every_page_it_held() {
        let mut log: Log<u32> = Log::new();
        log.restore(None).unwrap();
        log.discard(Some(&json!({"start": 2, "next": 9, "page": 4})));
        assert!(log.take_dirty());
        assert_eq!(written(&mut log), vec![(0, None), (1, None), (2, None)]);
    }

    #[tokio::test]
    async fn an_unbound_log_reads_from_memory() {
        let mut log: Log<u32> = Log::with_page_len(2);
        log.extend(0..5);
        let latest = log.latest(3).await.unwrap();
        assert_eq!(
            latest,
            LogSlice {
                first: 2,
                entries: vec![2, 3, 4]
            }
        );
        assert_eq!(latest.end(), 5);
        let from = log.from(1, 2).await.unwrap();
        assert_eq!(from.entries, vec![1, 2]);
        assert_eq!(log.from(7, 2).await.unwrap().first, 5);
        let _ = written(&mut log);
        assert!(matches!(log.latest(3).await, Err(TrayError::Closed)));
    }
}

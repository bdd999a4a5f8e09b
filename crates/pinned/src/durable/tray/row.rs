//! A tray's row as the worker keeps it between writes: each doc entry
//! encoded, so that a write re-encodes only the fields it touched and
//! assembles the row's text from the others as they are. It never decodes
//! on the write path; entries are decoded once, when the tray is restored.

use std::collections::BTreeMap;

use pinned_store::{Doc, DocText};

use super::field::Entry;

/// The doc entries of one tray row, by name, encoded.
#[derive(Debug, Default)]
pub(crate) struct Entries(BTreeMap<String, Entry>);

impl Entries {
    /// The entries of a stored (or fresh) doc.
    pub(crate) fn of(doc: &Doc) -> Result<Self, serde_json::Error> {
        doc.iter()
            .map(|(name, value)| Ok((name.clone(), Entry::of(value)?)))
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// Entry `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&Entry> {
        self.0.get(name)
    }

    /// Sets entry `name` (`None` removes it); true when that changed the row.
    pub(crate) fn put(&mut self, name: &str, entry: Option<Entry>) -> bool {
        match entry {
            Some(entry) => {
                if self.0.get(name) == Some(&entry) {
                    return false;
                }
                self.0.insert(name.to_owned(), entry);
                true
            }
            None => self.0.remove(name).is_some(),
        }
    }

    /// The row's doc, as the text the store writes.
    pub(crate) fn text(&self) -> DocText {
        DocText::from_entries(
            self.0
                .iter()
                .map(|(name, entry)| (name.as_str(), entry.raw())),
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may panic on the unexpected
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_a_different_entry_changes_the_row_and_the_text_is_the_docs() {
        let mut doc = Doc::new();
        doc.insert("done".into(), json!(["a"]));
        let mut entries = Entries::of(&doc).unwrap();
        assert!(!entries.put("done", Some(Entry::of(&["a"]).unwrap())));
        assert!(entries.put("queue", Some(Entry::of(&[json!({"name": "b"})]).unwrap())));
        assert!(entries.put("done", None));
        assert!(!entries.put("done", None));
        doc.remove("done");
        doc.insert("queue".into(), json!([{"name": "b"}]));
        assert_eq!(entries.text(), DocText::from(doc));
    }
}

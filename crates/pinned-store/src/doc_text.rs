//! [`DocText`]: a tray row's payload already encoded, as the JSON object text every
//! backend writes.
//!
//! A writer that keeps its row's entries encoded (the trays re-encode only the fields a
//! write touched) assembles the row from them here, once, and every backend then sends
//! that text as it is: no tree of values is built, cloned or walked per write. It must
//! only ever hold the text of one JSON object; both constructors guarantee it.

use std::fmt;
use std::sync::Arc;

use serde_json::value::RawValue;
use serde_json::Value;

use crate::Doc;

/// A tray row's payload as JSON object text. Cheap to clone (the text is shared).
///
/// ```
/// use pinned_store::{Doc, DocText};
/// use serde_json::value::to_raw_value;
///
/// let done = to_raw_value(&["build", "test"]).unwrap();
/// let text = DocText::from_entries([("done", done.as_ref())]);
/// assert_eq!(text.as_str(), r#"{"done":["build","test"]}"#);
///
/// let mut doc = Doc::new();
/// doc.insert("done".into(), serde_json::json!(["build", "test"]));
/// assert_eq!(DocText::from(doc), text);
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct DocText(Arc<str>);

// === impl DocText ===

impl DocText {
    /// The object of `entries`, in the order given. Each value is valid JSON by its type;
    /// names are escaped here. A name given twice is the caller's mistake (JSON readers
    /// keep the last).
    pub fn from_entries<'a>(entries: impl IntoIterator<Item = (&'a str, &'a RawValue)>) -> Self {
        let entries = entries.into_iter();
        let mut text = String::with_capacity(2 + 64 * entries.size_hint().0);
        text.push('{');
        for (n, (name, value)) in entries.enumerate() {
            if n > 0 {
                text.push(',');
            }
            // Field names rarely need escaping: only those that do pay for it.
            if name.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
                // A string always encodes.
                text.push_str(&Value::from(name).to_string());
            } else {
                text.push('"');
                text.push_str(name);
                text.push('"');
            }
            text.push(':');
            text.push_str(value.get());
        }
        text.push('}');
        Self(Arc::from(text))
    }

    /// The JSON text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The payload decoded.
    ///
    /// # Errors
    ///
    /// Never for a `DocText` built by its constructors; the error is serde's, for
    /// callers that must not assume.
    pub fn to_doc(&self) -> Result<Doc, serde_json::Error> {
        serde_json::from_str(&self.0)
    }
}

impl From<Doc> for DocText {
    fn from(doc: Doc) -> Self {
        // A map of JSON values always encodes.
        Self(Arc::from(Value::Object(doc).to_string()))
    }
}

impl fmt::Debug for DocText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may panic on the unexpected
mod tests {
    use super::*;
    use serde_json::json;
    use serde_json::value::to_raw_value;

    #[test]
    fn entries_assemble_the_same_text_a_doc_encodes_to() {
        let queue = to_raw_value(&json!([{"name": "a \"quoted\" job"}])).unwrap();
        let attempts = to_raw_value(&2).unwrap();
        let text = DocText::from_entries([("queue", queue.as_ref()), ("~att", attempts.as_ref())]);
        let doc = text.to_doc().unwrap();
        assert_eq!(doc["queue"][0]["name"], "a \"quoted\" job");
        assert_eq!(doc["~att"], 2);
        let name = to_raw_value(&1).unwrap();
        let escaped = DocText::from_entries([("we\"ird\n", name.as_ref())]);
        assert_eq!(escaped.to_doc().unwrap()["we\"ird\n"], 1);
        assert_eq!(DocText::from_entries([]).as_str(), "{}");
    }
}

//! An error with its causes on one line, for log fields.
//!
//! Owns the rendering only: the error's own text, then each `source()` in
//! turn after `": "`. A cause whose text the line already holds is left out
//! (a wrapper that prints its source, as many `thiserror` variants do,
//! would otherwise say it twice). Never allocates unless displayed.

use std::error::Error;
use std::fmt;

/// Most causes rendered: a chain longer than this is cut (a source loop
/// must not hang a log line).
const MAX_DEPTH: usize = 16;

/// `error = %Chain(&e)`: `e`'s text and its causes, outermost first.
///
/// A `reqwest` error alone says `error sending request for url (…)`; with
/// its chain it says why (`…: client error (Connect): invalid peer
/// certificate: …`).
///
/// ```
/// use pinned_edge::logging::Chain;
///
/// #[derive(Debug)]
/// struct Outer(std::io::Error);
/// impl std::fmt::Display for Outer {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         f.write_str("could not register")
///     }
/// }
/// impl std::error::Error for Outer {
///     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
///         Some(&self.0)
///     }
/// }
///
/// let e = Outer(std::io::Error::other("connection refused"));
/// assert_eq!(Chain(&e).to_string(), "could not register: connection refused");
/// ```
#[derive(Clone, Copy)]
pub struct Chain<'a>(pub &'a (dyn Error + 'a));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut line = self.0.to_string();
        let mut source = self.0.source();
        for _ in 0..MAX_DEPTH {
            let Some(cause) = source else { break };
            let text = cause.to_string();
            if !text.is_empty() && !line.contains(&text) {
                line.push_str(": ");
                line.push_str(&text);
            }
            source = cause.source();
        }
        f.write_str(&line)
    }
}

impl fmt::Debug for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl fmt::Display for Layer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl Error for Layer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_deref().map(|l| l as &(dyn Error + 'static))
        }
    }

    fn chain(texts: &[&'static str]) -> Layer {
        texts
            .iter()
            .rev()
            .fold(None, |inner, text| Some(Layer(text, inner.map(Box::new))))
            .expect("one layer")
    }

    #[test]
    fn every_cause_once_outermost_first() {
        let e = chain(&[
            "register failed",
            "client error (Connect)",
            "CaUsedAsEndEntity",
        ]);
        assert_eq!(
            Chain(&e).to_string(),
            "register failed: client error (Connect): CaUsedAsEndEntity"
        );
        // A wrapper that printed its source already: not twice.
        let e = chain(&["store: timed out", "timed out", ""]);
        assert_eq!(Chain(&e).to_string(), "store: timed out");
        assert_eq!(Chain(&chain(&["alone"])).to_string(), "alone");
    }

    #[test]
    fn a_long_chain_is_cut() {
        let texts: Vec<&'static str> = (0..40)
            .map(|i| &*Box::leak(format!("layer{i:02}").into_boxed_str()))
            .collect();
        let line = Chain(&chain(&texts)).to_string();
        assert!(line.ends_with("layer16"), "{line}");
    }
}

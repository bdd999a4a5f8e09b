//! Splitting a data-plane path `/<ns>/<id><rest>` without allocating.
//!
//! Owns only the split; id validation is `pinned_wire::ids`.

/// The parts of a data-plane path, borrowed from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target<'a> {
    /// Namespace with its leading slash (`/counter`).
    pub ns: &'a str,
    /// The raw (still percent-encoded) id segment; may be empty.
    pub raw_id: &'a str,
    /// `/<ns>/<id>`: the route-cache key when the id has no escapes.
    pub key: &'a str,
}

/// Split `path`; `None` when it has no id segment (`/`, `/counter`).
pub fn split(path: &str) -> Option<Target<'_>> {
    // Bytes, not `str::find`: on a path this short a plain scan beats the
    // searcher's setup (`proxy-bench`: 340 instructions a request with it,
    // 123 without). Every cut is at an ASCII `/`, so each slice below is
    // on a char boundary.
    let bytes = path.as_bytes();
    let slash = |from: usize| bytes.get(from..)?.iter().position(|&b| b == b'/');
    let after_ns = slash(1)? + 1;
    if after_ns == 1 {
        // `//…`: empty namespace.
        return None;
    }
    let id_start = after_ns + 1;
    let id_end = slash(id_start).map_or(path.len(), |i| id_start + i);
    Some(Target {
        ns: &path[..after_ns],
        raw_id: &path[id_start..id_end],
        key: &path[..id_end],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits() {
        let t = split("/counter/abc/hit").expect("split");
        assert_eq!((t.ns, t.raw_id, t.key), ("/counter", "abc", "/counter/abc"));
        let t = split("/counter/abc").expect("split");
        assert_eq!((t.ns, t.raw_id, t.key), ("/counter", "abc", "/counter/abc"));
        let t = split("/counter/").expect("split");
        assert_eq!(t.raw_id, "");
        let t = split("/counter//x").expect("split");
        assert_eq!(t.raw_id, "");
        assert_eq!(split("/counter"), None);
        assert_eq!(split("/"), None);
        assert_eq!(split("//a"), None);
        assert_eq!(split(""), None);
        assert_eq!(split("*"), None);
    }
}

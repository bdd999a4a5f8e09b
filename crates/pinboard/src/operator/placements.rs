//! A page of placements: filtered by namespace, owner tag, owner session
//! and id (a substring), sorted by `(namespace, id)`, cut after a keyset
//! cursor so paging stays right while rows come and go.
//!
//! Owns the filter and the cursor; never reads the store itself (the
//! caller hands it the rows), so it is a plain function over a list.

use std::collections::HashMap;

use pinned_wire::ids::validate_namespace;
use serde::{Deserialize, Serialize};

use super::{DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT};
use crate::placement::{LiveWorker, PlacementEntry};
use crate::registry::RegistryError;

/// Query of `GET /registry/placements`.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct PlacementQuery {
    /// Only this namespace (with its slash).
    pub ns: Option<String>,
    /// Only rows stamped with this owner tag.
    pub tag: Option<String>,
    /// Only ids containing this text.
    pub id: Option<String>,
    /// Only rows owned by this session.
    pub owner: Option<String>,
    /// Only rows after this cursor (`next` of the previous page).
    pub after: Option<String>,
    /// Most rows (default [`DEFAULT_PAGE_LIMIT`], at most [`MAX_PAGE_LIMIT`]).
    pub limit: Option<usize>,
}

/// One row of a page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlacementView {
    /// Namespace with its slash.
    pub ns: String,
    /// Instance id.
    pub id: String,
    /// Owning session.
    pub session_id: String,
    /// The owner's hostname binding, if it is live and has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Placement epoch (decimal string, as epochs travel on the wire).
    pub epoch: String,
    /// Owner tag, if stamped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Whether the owning session is live.
    pub live: bool,
}

/// Answer of `GET /registry/placements`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlacementPage {
    /// The rows, sorted by `(ns, id)`.
    pub placements: Vec<PlacementView>,
    /// Rows matching the filters in all pages.
    pub matched: usize,
    /// Cursor of the next page (`after=`), `null` on the last one.
    pub next: Option<String>,
}

fn malformed(msg: impl Into<String>) -> RegistryError {
    RegistryError::Malformed(msg.into())
}

/// The cursor after a row: `<ns>/<id>` (a namespace holds no `/` after
/// its first character and an id none at all, so it splits back).
fn cursor(ns: &str, id: &str) -> String {
    format!("{ns}/{id}")
}

fn parse_cursor(after: &str) -> Result<(&str, &str), RegistryError> {
    after
        .rsplit_once('/')
        .filter(|(ns, id)| validate_namespace(ns).is_ok() && !id.is_empty())
        .ok_or_else(|| malformed(format!("after must be a cursor <ns>/<id>, got {after:?}")))
}

impl PlacementQuery {
    /// The effective page size.
    ///
    /// # Errors
    ///
    /// 400 when `limit` is 0 or above [`MAX_PAGE_LIMIT`].
    pub fn page_limit(&self) -> Result<usize, RegistryError> {
        match self.limit {
            None => Ok(DEFAULT_PAGE_LIMIT),
            Some(n) if (1..=MAX_PAGE_LIMIT).contains(&n) => Ok(n),
            Some(n) => Err(malformed(format!(
                "limit must be between 1 and {MAX_PAGE_LIMIT}, got {n}"
            ))),
        }
    }

    /// One page of `rows` (any order), owners' hostnames from `workers`.
    ///
    /// # Errors
    ///
    /// 400 for a malformed namespace, cursor or limit.
    pub fn page(
        &self,
        mut rows: Vec<PlacementEntry>,
        workers: &[LiveWorker],
    ) -> Result<PlacementPage, RegistryError> {
        let limit = self.page_limit()?;
        if let Some(ns) = &self.ns {
            validate_namespace(ns).map_err(|e| malformed(e.to_string()))?;
        }
        let after = self.after.as_deref().map(parse_cursor).transpose()?;
        let hostnames: HashMap<&str, &str> = workers
            .iter()
            .filter_map(|w| Some((w.record.session_id.as_str(), w.record.hostname.as_deref()?)))
            .collect();
        rows.retain(|r| {
            self.ns.as_deref().is_none_or(|ns| r.ns == ns)
                && self
                    .tag
                    .as_deref()
                    .is_none_or(|t| r.tag.as_deref() == Some(t))
                && self.id.as_deref().is_none_or(|id| r.id.contains(id))
                && self
                    .owner
                    .as_deref()
                    .is_none_or(|o| r.placement.session_id == o)
        });
        let matched = rows.len();
        rows.sort_unstable_by(|a, b| (&a.ns, &a.id).cmp(&(&b.ns, &b.id)));
        let start = match after {
            Some((ns, id)) => rows.partition_point(|r| (r.ns.as_str(), r.id.as_str()) <= (ns, id)),
            None => 0,
        };
        let rest = &rows[start..];
        let next = (rest.len() > limit).then(|| {
            let last = &rest[limit - 1];
            cursor(&last.ns, &last.id)
        });
        let placements = rest
            .iter()
            .take(limit)
            .map(|r| PlacementView {
                ns: r.ns.clone(),
                id: r.id.clone(),
                session_id: r.placement.session_id.clone(),
                hostname: hostnames
                    .get(r.placement.session_id.as_str())
                    .map(|h| (*h).to_owned()),
                epoch: r.placement.epoch.to_string(),
                tag: r.tag.clone(),
                live: r.live,
            })
            .collect();
        Ok(PlacementPage {
            placements,
            matched,
            next,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::Placement;

    fn row(ns: &str, id: &str, owner: &str, tag: Option<&str>) -> PlacementEntry {
        PlacementEntry {
            ns: ns.into(),
            id: id.into(),
            placement: Placement {
                session_id: owner.into(),
                epoch: 3,
            },
            tag: tag.map(Into::into),
            live: true,
            settled: true,
        }
    }

    #[test]
    fn pages_follow_the_cursor_and_filters_combine() {
        let rows: Vec<PlacementEntry> = (0..25)
            .map(|i| {
                row(
                    "/c",
                    &format!("id{i:02}"),
                    if i % 2 == 0 { "s1" } else { "s2" },
                    None,
                )
            })
            .chain([row("/chat", "lobby", "s1", Some("blue"))])
            .collect();
        let mut q = PlacementQuery {
            ns: Some("/c".into()),
            limit: Some(10),
            ..Default::default()
        };
        let mut seen = Vec::new();
        loop {
            let page = q.page(rows.clone(), &[]).expect("page");
            assert_eq!(page.matched, 25);
            seen.extend(page.placements.iter().map(|p| p.id.clone()));
            match page.next {
                Some(next) => q.after = Some(next),
                None => break,
            }
        }
        assert_eq!(seen.len(), 25);
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");

        let q = PlacementQuery {
            tag: Some("blue".into()),
            ..Default::default()
        };
        let page = q.page(rows.clone(), &[]).expect("page");
        assert_eq!(page.placements.len(), 1);
        assert_eq!(page.placements[0].id, "lobby");
        let q = PlacementQuery {
            id: Some("id1".into()),
            owner: Some("s2".into()),
            ..Default::default()
        };
        let page = q.page(rows, &[]).expect("page");
        let ids: Vec<_> = page.placements.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["id11", "id13", "id15", "id17", "id19"]);
    }

    #[test]
    fn bad_limits_cursors_and_namespaces_are_refused_with_a_reason() {
        for q in [
            PlacementQuery {
                limit: Some(0),
                ..Default::default()
            },
            PlacementQuery {
                limit: Some(MAX_PAGE_LIMIT + 1),
                ..Default::default()
            },
            PlacementQuery {
                after: Some("nope".into()),
                ..Default::default()
            },
            PlacementQuery {
                ns: Some("counter".into()),
                ..Default::default()
            },
        ] {
            let err = q.page(Vec::new(), &[]).expect_err("refused");
            assert_eq!(err.status(), 400, "{q:?}");
        }
    }
}

//! `pinboard state list | show | unpark | skip | pause | resume | delete |
//! audit`: the storage inspector and the per-key controls from the command
//! line, each one call to pinboard's `/registry/state/…`.
//!
//! Owns these commands' arguments and how their answers print; never
//! reaches a worker or the store itself.

use clap::Subcommand;
use serde_json::{json, Value};

use super::client::OperatorClient;
use super::error::CliError;
use super::{pretty, table};
use crate::server::paths;

/// One `pinboard state` command.
#[derive(Debug, Subcommand)]
pub enum StateCommand {
    /// Ids of a namespace holding durable state, a page at a time (a
    /// filtered page scans `--limit` ids and may show fewer: follow `next`).
    List {
        /// Namespace (`/counter`).
        ns: String,
        /// Only ids with a marked row (tray work pending).
        #[arg(long, group = "filter")]
        marked: bool,
        /// Only ids with a parked tray.
        #[arg(long, group = "filter")]
        parked: bool,
        /// Only ids whose alarm or a schedule is due.
        #[arg(long, group = "filter")]
        alarm_due: bool,
        /// The `next` cursor of the previous page.
        #[arg(long)]
        after: Option<String>,
        /// Ids scanned (1 to 200; default 50).
        #[arg(long)]
        limit: Option<usize>,
    },
    /// One id's rows decoded: trays (fields, marks, park, attempts, dead
    /// letters), alarm and schedules, pause, epoch, world, placement.
    Show {
        /// Namespace.
        ns: String,
        /// Instance id.
        id: String,
    },
    /// Clear a parked tray's park and attempts: its head item is delivered afresh.
    Unpark {
        /// Namespace.
        ns: String,
        /// Instance id.
        id: String,
        /// The tray (its declared name).
        tray: String,
        /// The tray's key (a keyed tray; `~` for a singleton).
        #[arg(long, default_value = "~")]
        key: String,
        /// Who asks, for the audit list.
        #[arg(long)]
        by: Option<String>,
    },
    /// Skip a tray's head item (acked without its handler) into the tray's dead letters.
    Skip {
        /// Namespace.
        ns: String,
        /// Instance id.
        id: String,
        /// The tray.
        tray: String,
        /// The tray's key.
        #[arg(long, default_value = "~")]
        key: String,
        /// Who asks.
        #[arg(long)]
        by: Option<String>,
    },
    /// Pause an id: it is closed and refuses activation (503) until resumed.
    Pause {
        /// Namespace.
        ns: String,
        /// Instance id.
        id: String,
        /// Who asks.
        #[arg(long)]
        by: Option<String>,
    },
    /// Resume a paused id.
    Resume {
        /// Namespace.
        ns: String,
        /// Instance id.
        id: String,
        /// Who asks.
        #[arg(long)]
        by: Option<String>,
    },
    /// Delete every row of an id (its epoch stays).
    Delete {
        /// Namespace.
        ns: String,
        /// Instance id.
        id: String,
        /// Who asks.
        #[arg(long)]
        by: Option<String>,
    },
    /// The state controls asked for on the node answering, newest first.
    Audit {
        /// Most entries (1 to 256).
        #[arg(long, default_value_t = crate::operator::state::DEFAULT_AUDIT_LIMIT)]
        limit: usize,
    },
}

fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Runs `command`; answers what to print.
///
/// # Errors
///
/// See [`CliError`].
pub async fn run(
    client: &OperatorClient,
    json_out: bool,
    command: StateCommand,
) -> Result<String, CliError> {
    let act = |ns: String, id: String, action: &str, tray: Option<(String, String)>, by| {
        let mut body = json!({"ns": ns, "id": id, "action": action, "by": by});
        if let Some((tray, key)) = tray {
            body["tray"] = json!(tray);
            body["key"] = json!(key);
        }
        body
    };
    let body = match command {
        StateCommand::List {
            ns,
            marked,
            parked,
            alarm_due,
            after,
            limit,
        } => {
            let filter = if marked {
                "marked"
            } else if parked {
                "parked"
            } else if alarm_due {
                "alarm-due"
            } else {
                "all"
            };
            let limit = limit.map(|n| n.to_string());
            let mut query = vec![("ns", ns.as_str()), ("filter", filter)];
            if let Some(after) = &after {
                query.push(("after", after));
            }
            if let Some(limit) = &limit {
                query.push(("limit", limit));
            }
            let answer: Value = client.get(paths::STATE_IDS, &query).await?;
            if json_out {
                return Ok(pretty(&answer));
            }
            let rows: Vec<Vec<String>> = answer["ids"]
                .as_array()
                .map(|ids| {
                    ids.iter()
                        .map(|s| {
                            let flag = |name: &str| if s[name] == json!(true) { "yes" } else { "" };
                            vec![
                                text(&s["id"]),
                                text(&s["rows"]),
                                text(&s["epoch"]),
                                flag("marked").to_owned(),
                                flag("parked").to_owned(),
                                flag("paused").to_owned(),
                                text(&s["alarmAtMs"]),
                            ]
                        })
                        .collect()
                })
                .unwrap_or_default();
            let mut out = table::render(
                &[
                    "ID",
                    "ROWS",
                    "EPOCH",
                    "MARKED",
                    "PARKED",
                    "PAUSED",
                    "ALARM AT (MS)",
                ],
                &rows,
            );
            if let Some(next) = answer["next"].as_str() {
                out.push_str(&format!("next page: --after {next}\n"));
            }
            return Ok(out);
        }
        StateCommand::Show { ns, id } => {
            let answer: Value = client
                .get(paths::STATE_SHOW, &[("ns", &ns), ("id", &id)])
                .await?;
            return Ok(pretty(&answer));
        }
        StateCommand::Audit { limit } => {
            let limit = limit.to_string();
            let answer: Value = client.get(paths::STATE_AUDIT, &[("limit", &limit)]).await?;
            if json_out {
                return Ok(pretty(&answer));
            }
            let rows: Vec<Vec<String>> = answer["actions"]
                .as_array()
                .map(|all| {
                    all.iter()
                        .map(|a| {
                            [
                                "atMs", "ns", "id", "action", "tray", "by", "owner", "epoch",
                                "status", "detail",
                            ]
                            .iter()
                            .map(|name| text(&a[*name]))
                            .collect()
                        })
                        .collect()
                })
                .unwrap_or_default();
            return Ok(table::render(
                &[
                    "AT (UNIX MS)",
                    "NAMESPACE",
                    "ID",
                    "ACTION",
                    "TRAY",
                    "BY",
                    "OWNER",
                    "EPOCH",
                    "STATUS",
                    "DETAIL",
                ],
                &rows,
            ));
        }
        StateCommand::Unpark {
            ns,
            id,
            tray,
            key,
            by,
        } => act(ns, id, "unpark", Some((tray, key)), by),
        StateCommand::Skip {
            ns,
            id,
            tray,
            key,
            by,
        } => act(ns, id, "skip", Some((tray, key)), by),
        StateCommand::Pause { ns, id, by } => act(ns, id, "pause", None, by),
        StateCommand::Resume { ns, id, by } => act(ns, id, "resume", None, by),
        StateCommand::Delete { ns, id, by } => act(ns, id, "delete", None, by),
    };
    let answer: Value = client.post(paths::STATE_ACT, &body).await?;
    if json_out {
        return Ok(pretty(&answer));
    }
    Ok(format!(
        "{} {}{}: done at epoch {} ({})\n",
        text(&answer["action"]),
        text(&answer["ns"]),
        answer["id"]
            .as_str()
            .map(|id| format!("/{id}"))
            .unwrap_or_default(),
        text(&answer["epoch"]),
        answer["outcome"],
    ))
}

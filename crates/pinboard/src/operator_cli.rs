//! `pinboard workers | placements | drain | undrain | wind-down | sweeper |
//! moves | state …`: operator commands against a running pinboard (`--url` /
//! `PINBOARD_URL`, the operator token from `PINBOARD_OPERATOR_TOKEN`).
//!
//! Owns the command line of those commands, how their answers print
//! (aligned tables, or the JSON pinboard answered with `--json`) and their
//! exit codes ([`error`]). Never decides anything pinboard decides: every
//! worker action is one `/registry/push`, every state control one
//! `/registry/state/act` ([`state`]), every view one `GET`.
//!
//! The token is read from the environment only, never from a flag, so it
//! does not show in `ps` or a shell history.

pub mod client;
pub mod deadline;
pub mod error;
pub mod state;
pub mod table;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use pinned_wire::registry::{PushRequest, WorkerRow, WorkersResponse};
use serde_json::Value;

use self::client::OperatorClient;
use self::deadline::parse_deadline;
use self::error::CliError;
use crate::operator::moves::Move;
use crate::operator::placements::PlacementPage;
use crate::operator::sweeper_status::SweeperStatus;
use crate::server::paths;

/// Default `--url`.
pub const DEFAULT_URL: &str = "http://127.0.0.1:7070";
/// Default `--timeout` of each call, in seconds.
pub const DEFAULT_TIMEOUT_SECS: u64 = 10;
/// Default `wind-down --deadline` (a wind-down needs one: `null` revokes).
pub const DEFAULT_WIND_DOWN_DEADLINE: &str = "30s";
/// Most placements `placements --all` reads (pages of the largest size).
pub const MAX_LISTED_PLACEMENTS: usize = 100_000;
/// The environment variable holding the operator token.
pub const TOKEN_ENV: &str = "PINBOARD_OPERATOR_TOKEN";

/// The first arguments that select an operator command.
pub const COMMANDS: [&str; 8] = [
    "workers",
    "placements",
    "drain",
    "undrain",
    "wind-down",
    "sweeper",
    "moves",
    "state",
];

/// Operator commands against a running pinboard.
#[derive(Debug, Parser)]
#[command(
    name = "pinboard",
    about = "Operator commands against a running pinboard (token from PINBOARD_OPERATOR_TOKEN)",
    after_help = "Exit codes: 0 ok, 1 target not found, 64 usage, 65 refused by pinboard (400), \
                  69 pinboard unreachable or failing (5xx), 70 unexpected answer, 75 conflict (409: not \
                  parked, paused, a Python owner, a newer owner), 77 token refused."
)]
pub struct OperatorArgs {
    /// pinboard's base URL.
    #[arg(long, env = "PINBOARD_URL", default_value = DEFAULT_URL, global = true)]
    pub url: String,
    /// PEM file of extra CA certificates trusted for an `https://` pinboard
    /// (beside the Mozilla roots).
    #[arg(long, env = "PINBOARD_CA", global = true)]
    pub ca: Option<std::path::PathBuf>,
    /// Print pinboard's JSON answer instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// Deadline of each call to pinboard (30s, 500ms, 2m).
    #[arg(long, global = true, default_value = "10s")]
    pub timeout: String,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// One operator command.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Live workers: session, hostname, env, advertise URL, headroom, instances, lease, state.
    Workers,
    /// Placements (sorted by namespace and id), filtered.
    Placements {
        /// Only this namespace (`/counter`).
        #[arg(long)]
        ns: Option<String>,
        /// Only placements stamped with this owner tag.
        #[arg(long)]
        tag: Option<String>,
        /// Only ids containing this text.
        #[arg(long)]
        id: Option<String>,
        /// Only placements owned by this session.
        #[arg(long)]
        owner: Option<String>,
        /// Most rows (1 to 1000); with `--all`, the page size.
        #[arg(long, default_value_t = crate::operator::DEFAULT_PAGE_LIMIT)]
        limit: usize,
        /// Follow the pages to the end (at most 100 000 rows).
        #[arg(long)]
        all: bool,
    },
    /// Drain workers: no new placements, idle instances evicted, the rest
    /// aborted at the deadline (none: never aborted).
    Drain {
        /// A session id, a unique prefix of one (4+ characters), or a
        /// hostname (every live worker bound to it).
        target: String,
        /// Drain deadline (30s, 2m, none).
        #[arg(long, default_value = "none")]
        deadline: String,
    },
    /// Lift an operator drain.
    Undrain {
        /// A session id, a unique prefix of one, or a hostname.
        target: String,
    },
    /// Wind down one instance on its owner: it finishes in-flight work and
    /// releases its placement by the deadline.
    WindDown {
        /// Namespace (`/counter`).
        ns: String,
        /// Instance id.
        id: String,
        /// Deadline (30s, 2m).
        #[arg(long, default_value = DEFAULT_WIND_DOWN_DEADLINE)]
        deadline: String,
    },
    /// The alarm and wake sweeper on the node answering.
    Sweeper,
    /// Recent re-placements seen by the node answering, newest first.
    Moves {
        /// Most moves (1 to 256).
        #[arg(long, default_value_t = crate::operator::DEFAULT_MOVES_LIMIT)]
        limit: usize,
    },
    /// The storage inspector and the per-key controls.
    State {
        /// What to see or do.
        #[command(subcommand)]
        command: state::StateCommand,
    },
}

/// Whether `args` (the process arguments) start an operator command.
pub fn is_operator_command(first: &std::ffi::OsStr) -> bool {
    COMMANDS.iter().any(|c| first == *c)
}

/// Runs an operator command as a process; returns its exit code.
pub fn main() -> ExitCode {
    let args = match OperatorArgs::try_parse() {
        Ok(args) => args,
        Err(e) => {
            let code = if e.use_stderr() {
                error::EXIT_USAGE
            } else {
                error::EXIT_OK
            };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("pinboard: cannot start the runtime: {e}");
            return ExitCode::from(error::EXIT_UNEXPECTED);
        }
    };
    match runtime.block_on(run(args)) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pinboard: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn usage(msg: impl Into<String>) -> CliError {
    CliError::Usage(msg.into())
}

fn deadline(text: &str) -> Result<Option<f64>, CliError> {
    parse_deadline(text).map_err(usage)
}

/// Runs `args`; answers what to print on success.
///
/// # Errors
///
/// See [`CliError`]; each carries its exit code.
pub async fn run(args: OperatorArgs) -> Result<String, CliError> {
    let token = std::env::var(TOKEN_ENV)
        .ok()
        .filter(|t| !t.trim().is_empty())
        .ok_or_else(|| usage(format!("set {TOKEN_ENV} to the operator token")))?;
    let timeout = match deadline(&args.timeout)? {
        Some(s) if s > 0.0 => Duration::from_secs_f64(s),
        _ => return Err(usage("--timeout must be a positive duration")),
    };
    if !args.url.starts_with("http://") && !args.url.starts_with("https://") {
        return Err(usage(format!(
            "--url must be http(s)://host:port, got {:?}",
            args.url
        )));
    }
    let client = OperatorClient::new(&args.url, token, timeout, args.ca.as_deref())?;
    let json = args.json;
    match args.command {
        Command::Workers => {
            let answer: Value = client.get(paths::WORKERS, &[]).await?;
            if json {
                return Ok(pretty(&answer));
            }
            let workers: WorkersResponse = decode(answer)?;
            Ok(workers_table(&workers.workers))
        }
        Command::Placements {
            ns,
            tag,
            id,
            owner,
            limit,
            all,
        } => {
            let limit_text = limit.to_string();
            let mut query: Vec<(&str, &str)> = vec![("limit", &limit_text)];
            for (key, value) in [("ns", &ns), ("tag", &tag), ("id", &id), ("owner", &owner)] {
                if let Some(v) = value {
                    query.push((key, v));
                }
            }
            let mut page: PlacementPage = client.get(paths::PLACEMENTS, &query).await?;
            let mut rows = std::mem::take(&mut page.placements);
            while all && rows.len() < MAX_LISTED_PLACEMENTS {
                let Some(after) = page.next.take() else { break };
                let mut q = query.clone();
                q.push(("after", &after));
                page = client.get(paths::PLACEMENTS, &q).await?;
                rows.append(&mut page.placements);
            }
            page.placements = rows;
            if json {
                return Ok(pretty(&page));
            }
            let mut out = table::render(
                &[
                    "NAMESPACE",
                    "ID",
                    "OWNER",
                    "HOSTNAME",
                    "EPOCH",
                    "TAG",
                    "LIVE",
                ],
                &page
                    .placements
                    .iter()
                    .map(|p| {
                        vec![
                            p.ns.clone(),
                            p.id.clone(),
                            p.session_id.clone(),
                            p.hostname.clone().unwrap_or_else(|| "-".into()),
                            p.epoch.clone(),
                            p.tag.clone().unwrap_or_else(|| "-".into()),
                            if p.live { "yes" } else { "no" }.into(),
                        ]
                    })
                    .collect::<Vec<_>>(),
            );
            if let Some(next) = &page.next {
                out.push_str(&format!(
                    "{} of {} shown; more with --all (next page after {next})\n",
                    page.placements.len(),
                    page.matched
                ));
            }
            Ok(out)
        }
        Command::Drain {
            target,
            deadline: text,
        } => {
            let secs = deadline(&text)?;
            let sessions = targets(&client, &target).await?;
            for w in &sessions {
                let _: Value = client
                    .post(
                        paths::PUSH,
                        &PushRequest::Drain {
                            session_id: w.session_id.clone(),
                            deadline: secs,
                        },
                    )
                    .await?;
            }
            let when = secs.map_or("no deadline".to_owned(), |s| format!("deadline {s}s"));
            acted(json, "drained", &sessions, &when)
        }
        Command::Undrain { target } => {
            let sessions = targets(&client, &target).await?;
            for w in &sessions {
                let _: Value = client
                    .post(
                        paths::PUSH,
                        &PushRequest::Undrain {
                            session_id: w.session_id.clone(),
                        },
                    )
                    .await?;
            }
            acted(json, "undrained", &sessions, "")
        }
        Command::WindDown {
            ns,
            id,
            deadline: text,
        } => {
            let secs = deadline(&text)?.ok_or_else(|| {
                usage("wind-down needs a deadline (a wind-down without one revokes it)")
            })?;
            let page: PlacementPage = client
                .get(
                    paths::PLACEMENTS,
                    &[("ns", &ns), ("id", &id), ("limit", "1000")],
                )
                .await?;
            let owner = page
                .placements
                .iter()
                .find(|p| p.id == id && p.live)
                .map(|p| p.session_id.clone())
                .ok_or_else(|| CliError::NotFound(format!("no live placement of {ns}/{id}")))?;
            let answer: Value = client
                .post(
                    paths::PUSH,
                    &PushRequest::WindDown {
                        session_id: owner.clone(),
                        ns: ns.clone(),
                        id: id.clone(),
                        deadline: Some(secs),
                    },
                )
                .await?;
            if json {
                return Ok(pretty(&serde_json::json!({
                    "windDown": { "ns": ns, "id": id, "sessionId": owner, "deadline": secs },
                    "msgId": answer.get("msgId"),
                })));
            }
            Ok(format!(
                "winding down {ns}/{id} on {owner} (deadline {secs}s)\n"
            ))
        }
        Command::Sweeper => {
            let status: SweeperStatus = client.get(paths::SWEEPER, &[]).await?;
            if json {
                return Ok(pretty(&status));
            }
            let last = status
                .last_lap_ago_ms
                .map_or("never".to_owned(), |ms| format!("{} ago", seconds(ms)));
            Ok(table::render(
                &[
                    "ENABLED",
                    "HELD HERE",
                    "LAPS",
                    "LAST LAP",
                    "ALARMS",
                    "WAKES",
                    "FAILURES",
                ],
                &[vec![
                    yes_no(status.enabled),
                    yes_no(status.held_here),
                    status.laps.to_string(),
                    last,
                    status.alarms_delivered.to_string(),
                    status.wakes.to_string(),
                    status.failures.to_string(),
                ]],
            ))
        }
        Command::State { command } => state::run(&client, json, command).await,
        Command::Moves { limit } => {
            let limit = limit.to_string();
            let answer: Value = client.get(paths::MOVES, &[("limit", &limit)]).await?;
            if json {
                return Ok(pretty(&answer));
            }
            let moves: Vec<Move> = decode(answer.get("moves").cloned().unwrap_or(Value::Null))?;
            Ok(table::render(
                &[
                    "AT (UNIX MS)",
                    "NAMESPACE",
                    "ID",
                    "FROM",
                    "TO",
                    "EPOCH",
                    "WHY",
                    "BY",
                ],
                &moves
                    .iter()
                    .map(|m| {
                        vec![
                            m.at_ms.to_string(),
                            m.ns.clone(),
                            m.id.clone(),
                            m.from.clone(),
                            m.to.clone(),
                            m.epoch.clone(),
                            m.reason.as_str().to_owned(),
                            m.by.as_str().to_owned(),
                        ]
                    })
                    .collect::<Vec<_>>(),
            ))
        }
    }
}

fn pretty<T: serde::Serialize>(value: &T) -> String {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text
}

fn decode<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, CliError> {
    serde_json::from_value(value)
        .map_err(|e| CliError::Unexpected(format!("unexpected answer ({e})")))
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.to_owned()
}

fn seconds(ms: u64) -> String {
    format!("{:.1}s", ms as f64 / 1000.0)
}

/// The workers `target` names: an exact session, every worker bound to
/// the hostname `target`, or the one session `target` is a prefix of.
async fn targets(client: &OperatorClient, target: &str) -> Result<Vec<WorkerRow>, CliError> {
    let workers: WorkersResponse = client.get(paths::WORKERS, &[]).await?;
    let live = workers.workers;
    if let Some(w) = live.iter().find(|w| w.session_id == target) {
        return Ok(vec![w.clone()]);
    }
    let bound: Vec<WorkerRow> = live
        .iter()
        .filter(|w| w.hostname.as_deref() == Some(target))
        .cloned()
        .collect();
    if !bound.is_empty() {
        return Ok(bound);
    }
    let prefixed: Vec<&WorkerRow> = live
        .iter()
        .filter(|w| target.len() >= 4 && w.session_id.starts_with(target))
        .collect();
    match prefixed.as_slice() {
        [one] => Ok(vec![(*one).clone()]),
        [] => Err(CliError::NotFound(format!(
            "no live worker has session or hostname {target:?}"
        ))),
        more => Err(usage(format!(
            "{target:?} is a prefix of {} sessions; give more of it",
            more.len()
        ))),
    }
}

fn acted(json: bool, verb: &str, sessions: &[WorkerRow], note: &str) -> Result<String, CliError> {
    if json {
        let ids: Vec<&str> = sessions.iter().map(|w| w.session_id.as_str()).collect();
        return Ok(pretty(&serde_json::json!({ verb: ids })));
    }
    Ok(sessions
        .iter()
        .map(|w| {
            let note = if note.is_empty() {
                String::new()
            } else {
                format!(" ({note})")
            };
            format!("{verb} {} {}{note}\n", w.session_id, w.advertise_url)
        })
        .collect())
}

fn workers_table(workers: &[WorkerRow]) -> String {
    table::render(
        &[
            "SESSION",
            "HOSTNAME",
            "ENV",
            "ADVERTISE",
            "NAMESPACES",
            "HEADROOM",
            "INSTANCES",
            "LEASE",
            "STATE",
        ],
        &workers
            .iter()
            .map(|w| {
                vec![
                    w.session_id.clone(),
                    w.hostname.clone().unwrap_or_else(|| "-".into()),
                    w.env.clone().unwrap_or_else(|| "-".into()),
                    w.advertise_url.clone(),
                    w.namespaces.join(","),
                    w.headroom.to_string(),
                    w.instances.to_string(),
                    seconds(w.expires_in_ms),
                    if w.draining { "draining" } else { "serving" }.to_owned(),
                ]
            })
            .collect::<Vec<_>>(),
    )
}

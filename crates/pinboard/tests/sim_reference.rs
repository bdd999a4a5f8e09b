//! The Python reference's own deterministic cluster simulation
//! (`python -m pinned.sim.e2e`, `pinned` 0.16.0) drives `pinboard
//! sim-coprocess`: two nodes, a crash mid-write, re-placement, a fence
//! check, a placement-store wipe and (with `--rollback`) a wall clock
//! stepped back. Launched as the spec describes (`shared/spec/sim-coprocess.md`
//! §1): `tests/sim/node` first on `PATH`, `PINNED_PINBOARD_DIR` at
//! `tests/sim/pb`.
//!
//! The interpreter is `$PINNED_PY` (default: the workspace's
//! `.venv/bin/python`), with `pinned==0.16.0` installed. Seeds: the plain
//! run takes `$PINBOARD_SIM_SEEDS` (default 5; `scripts/test` sets 100),
//! each rollback run half as many. A run may take 30 s plus 1 s per seed.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Longest one simulation run may take: this plus [`PER_SEED`] per seed.
const RUN_LIMIT: Duration = Duration::from_secs(30);
/// Added to [`RUN_LIMIT`] per seed (a seed takes about 0.4 s in a debug build).
const PER_SEED: Duration = Duration::from_secs(1);

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn python() -> PathBuf {
    let py = std::env::var_os("PINNED_PY")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            manifest_dir()
                .join("../../.venv/bin/python")
                .canonicalize()
                .unwrap_or_else(|_| manifest_dir().join("../../.venv/bin/python"))
        });
    assert!(
        py.exists(),
        "no Python for the reference simulation at {}: set PINNED_PY to an interpreter with \
         `pinned==0.16.0` installed (python3 -m venv .venv && .venv/bin/pip install pinned==0.16.0)",
        py.display()
    );
    py
}

fn seeds() -> u32 {
    std::env::var("PINBOARD_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5)
}

/// Runs `python -m pinned.sim.e2e <args>` (`seeds` of them) against our
/// coprocess, killed after [`RUN_LIMIT`] plus [`PER_SEED`] per seed.
fn run_sim(args: &[&str], seeds: u32) -> Output {
    let limit = RUN_LIMIT + PER_SEED * seeds;
    let sim_dir = manifest_dir().join("tests/sim");
    let path = match std::env::var_os("PATH") {
        Some(rest) => {
            let mut dirs = vec![sim_dir.clone()];
            dirs.extend(std::env::split_paths(&rest));
            std::env::join_paths(dirs).expect("PATH entries join")
        }
        None => sim_dir.clone().into_os_string(),
    };
    let mut child = Command::new(python())
        .args(["-m", "pinned.sim.e2e"])
        .args(args)
        .env("PATH", path)
        .env("PINNED_PINBOARD_DIR", sim_dir.join("pb"))
        .env("PINBOARD_SIM_BIN", env!("CARGO_BIN_EXE_pinboard"))
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "error".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the reference simulation");
    let started = Instant::now();
    // Drain the pipes on threads so a chatty run cannot block on them.
    let mut stdout = child.stdout.take().expect("stdout piped");
    let mut stderr = child.stderr.take().expect("stderr piped");
    let out = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stdout, &mut buf);
        buf
    });
    let err = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stderr, &mut buf);
        buf
    });
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the simulation") {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the simulation {args:?} took longer than {limit:?}; stderr:\n{}",
                String::from_utf8_lossy(&err.join().unwrap_or_default())
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
    }
}

fn assert_passed(args: &[&str], out: &Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the reference simulation {args:?} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
}

fn assert_seeds(n: u32, args: &[&str]) {
    let count = n.to_string();
    let mut all = vec!["--seeds", count.as_str()];
    all.extend_from_slice(args);
    let out = run_sim(&all, n);
    assert_passed(&all, &out);
    let passed = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("seed="))
        .count();
    assert_eq!(passed, n as usize, "one summary line per seed");
}

#[test]
fn reference_sim_passes() {
    assert_seeds(seeds(), &[]);
}

#[test]
fn reference_sim_passes_with_the_clock_stepped_back_a_minute() {
    assert_seeds((seeds() / 2).max(1), &["--rollback", "60"]);
}

#[test]
fn reference_sim_passes_with_the_clock_stepped_back_ten_minutes() {
    assert_seeds((seeds() / 2).max(1), &["--rollback", "600"]);
}

#[test]
fn a_seed_replays_identically() {
    let args = ["--seed", "3"];
    let first = run_sim(&args, 1);
    assert_passed(&args, &first);
    let second = run_sim(&args, 1);
    assert_passed(&args, &second);
    assert!(
        String::from_utf8_lossy(&first.stdout).lines().count() > 10,
        "a passing --seed prints its trace"
    );
    assert_eq!(
        String::from_utf8_lossy(&first.stdout),
        String::from_utf8_lossy(&second.stdout),
        "the same seed gave two different traces"
    );
}

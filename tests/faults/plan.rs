//! How much of everything a run does, and what must become of each job.

use std::collections::BTreeMap;
use std::time::Duration;

use pgfifo::Job;
use pgfifo_tests::faults::private_pg::StopMode;
use pgfifo_tests::faults::rng::Rng;
use pgfifo_tests::faults::runs::Mode;
use pgfifo_tests::records::now_ns;

use crate::jobs::{FaultJob, LONG_EVERY};

// --- The plan ---------------------------------------------------------------

/// How much of everything a run does.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) soak: bool,
    pub(crate) seed: u64,
    pub(crate) groups: u32,
    /// One group of the `faults` queue in this many runs up to 2 or 3 jobs
    /// at once (group concurrency N > 1, see `wide.rs`).
    pub(crate) wide_every: u32,
    pub(crate) min_jobs: usize,
    pub(crate) max_jobs: usize,
    pub(crate) wave: usize,
    pub(crate) backlog: i64,
    pub(crate) workers: usize,
    pub(crate) concurrency: usize,
    pub(crate) kills: usize,
    pub(crate) terminations: usize,
    pub(crate) restarts: usize,
    pub(crate) freezes: usize,
    pub(crate) prefetch_cuts: usize,
    pub(crate) poison: usize,
    pub(crate) hang_once: usize,
    pub(crate) hang_always: usize,
    pub(crate) panic_once: usize,
    pub(crate) panic_always: usize,
    /// Jobs per hot group in each burst (`hot.rs`).
    pub(crate) hot_burst: usize,
    /// SIGKILLs of the hot worker mid-burst (steps of their own, without
    /// a pause before them).
    pub(crate) hot_kills: usize,
    /// Hot jobs that panic on their first attempt.
    pub(crate) hot_panics: usize,
    pub(crate) step_ms: (u64, u64),
    pub(crate) work_ms: (u32, u32),
    pub(crate) drain_limit: Duration,
}

impl Plan {
    pub(crate) fn from_env() -> Plan {
        let soak = std::env::var("FAULTS_SOAK").is_ok_and(|v| !v.is_empty() && v != "0");
        let seed = std::env::var("FAULTS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| now_ns() as u64);
        if soak {
            Plan {
                soak,
                seed,
                groups: 400,
                wide_every: 5,
                min_jobs: 60_000,
                max_jobs: 400_000,
                wave: 1_500,
                backlog: 2_500,
                workers: 5,
                concurrency: 6,
                kills: 400,
                terminations: 12,
                restarts: 8,
                freezes: 5,
                prefetch_cuts: 3,
                poison: 4,
                hang_once: 10,
                hang_always: 4,
                panic_once: 20,
                panic_always: 6,
                hot_burst: 100,
                hot_kills: 40,
                hot_panics: 20,
                step_ms: (1_500, 3_500),
                work_ms: (40, 260),
                drain_limit: Duration::from_secs(300),
            }
        } else {
            Plan {
                soak,
                seed,
                groups: 125,
                wide_every: 5,
                min_jobs: 5_000,
                max_jobs: 10_000,
                wave: 1_000,
                backlog: 1_500,
                workers: 4,
                concurrency: 4,
                kills: 22,
                terminations: 2,
                restarts: 2,
                freezes: 1,
                prefetch_cuts: 1,
                poison: 1,
                hang_once: 3,
                hang_always: 1,
                panic_once: 5,
                panic_always: 2,
                hot_burst: 50,
                hot_kills: 4,
                hot_panics: 3,
                step_ms: (1_000, 2_000),
                work_ms: (40, 260),
                drain_limit: Duration::from_secs(90),
            }
        }
    }

    pub(crate) fn specials(&self) -> Vec<Mode> {
        let mut v = Vec::new();
        for (mode, n) in [
            (Mode::Poison, self.poison),
            (Mode::HangOnce, self.hang_once),
            (Mode::HangAlways, self.hang_always),
            (Mode::PanicOnce, self.panic_once),
            (Mode::PanicAlways, self.panic_always),
        ] {
            v.extend(std::iter::repeat_n(mode, n));
        }
        v
    }
}

/// How many of the jobs that fail an attempt and then succeed go into
/// groups of N > 1 (when the plan has that many): the hold-back is then
/// exercised.
pub(crate) const RETRYING_IN_WIDE: usize = 3;

/// Which groups of the `faults` queue run several jobs at once, and their
/// N (2 or 3): one in `plan.wide_every`, chosen by the seed (with a
/// generator of their own, so that the rest of the plan stays the same).
pub(crate) fn wide_groups(plan: &Plan) -> BTreeMap<u32, u32> {
    let mut rng = Rng::new(plan.seed.rotate_left(17) ^ 0x5749_4445);
    let mut groups: Vec<u32> = (0..plan.groups).collect();
    rng.shuffle(&mut groups);
    let n = (plan.groups / plan.wide_every.max(1)).max(1) as usize;
    groups
        .into_iter()
        .take(n)
        .enumerate()
        .map(|(i, grp)| (grp, 2 + (i % 2) as u32))
        .collect()
}

/// Whether group `grp` of the `faults` queue runs its jobs in long mode
/// (`faults.long`): one in [`LONG_EVERY`] of the groups of N = 1.
pub(crate) fn is_long_group(grp: u32, wide: &BTreeMap<u32, u32>) -> bool {
    grp % LONG_EVERY == 1 && !wide.contains_key(&grp)
}

/// The group name of group `grp` of the `faults` queue.
pub(crate) fn group_name(grp: u32) -> String {
    format!("g{grp:04}")
}

/// The max attempts a job of `mode` is enqueued with.
pub(crate) fn max_attempts(mode: Mode) -> u32 {
    match mode {
        Mode::Poison => 3,
        Mode::HangAlways | Mode::PanicAlways => 2,
        _ => FaultJob::MAX_ATTEMPTS,
    }
}

/// What the failure reason of a job that must fail must say. An attempt cut
/// off by another fault (kill, restart) on the last attempt legitimately
/// leaves "never finished" instead.
pub(crate) fn reason_fits(mode: Mode, reason: &str) -> bool {
    let cut = reason.contains("never finished");
    match mode {
        Mode::Poison => cut,
        Mode::HangAlways => reason.contains("timed out") || cut,
        Mode::PanicAlways => reason.contains("panicked") || cut,
        _ => false,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    Kill,
    /// SIGKILL the hot worker while it works through a burst.
    HotKill,
    Terminate,
    Restart(StopMode),
    Freeze,
    /// Terminate while a job waits in a runner's prefetch lane.
    PrefetchCut,
}

/// One enqueued job and what must become of it.
#[derive(Debug, Clone)]
pub(crate) struct Enqueued {
    pub(crate) id: i64,
    pub(crate) queue: &'static str,
    pub(crate) grp: u32,
    pub(crate) seq: u32,
    pub(crate) mode: Mode,
    pub(crate) max_attempts: u32,
}

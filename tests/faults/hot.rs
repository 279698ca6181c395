//! The hot groups: a few groups of N = 1 in a queue of their own (`hot`),
//! served by one worker process of their own, that get bursts of quick jobs
//! (`faults.hot`: 0–2 ms, the handler never takes the job's connection).
//! With such a backlog `pgfifo.pick` takes the next jobs of a group behind
//! its head (followers) and the lane runs them one after another in the
//! pick's transaction, committing once. A burst goes in before each fault
//! step, so the faults hit batches in progress; some steps SIGKILL the hot
//! worker while a burst runs. (A queue of their own: a pick takes followers
//! only when no other group of the runner's queues is ready, never the case
//! in `faults`, and a lane whose handlers take the connection picks one job
//! at a time.)
//!
//! A hot run's record reaches `fault_log` through the job's result, which
//! `pgfifo.complete` writes with its success (`jobs::FAULT_HOT`), so the checks
//! of every job and every committed run hold hot jobs to the same standard
//! as the others; `hot_checks.rs` adds the order of their recorded runs and
//! counts the followers.

use std::time::{Duration, Instant};

use pgfifo::{EnqueueOptions, Job, NewJob};
use pgfifo_tests::faults::runs::Mode;

use crate::jobs::{HotJob, HOT_GROUPS, HOT_GRP};
use crate::plan::Enqueued;
use crate::processes::Role;
use crate::suite::Suite;

/// The group name of hot group `i`.
fn hot_group_name(i: u32) -> String {
    format!("hot{i}")
}

impl Suite {
    /// Hot jobs still queued.
    async fn hot_queued(&mut self) -> i64 {
        self.monitor
            .scalar("SELECT count(*) FROM pgfifo.job WHERE state = 'queued' AND queue = 'hot'")
            .await
    }

    /// A burst of `plan.hot_burst` jobs in every hot group, unless half a
    /// burst is still queued. Whether one went in.
    pub(crate) async fn top_up_hot(&mut self) -> bool {
        let burst = self.plan.hot_burst;
        let all = burst * HOT_GROUPS as usize;
        if burst == 0 || self.hot_queued().await >= (all / 2) as i64 {
            return false;
        }
        let mut batch = Vec::with_capacity(all);
        for i in 0..HOT_GROUPS {
            let grp = HOT_GRP + i;
            // One planned panic per burst and group while there are any:
            // the rest of its batch is handed back.
            let panic_at = (!self.hot_specials.is_empty()).then(|| {
                self.hot_specials.pop();
                self.rng.below(burst)
            });
            for k in 0..burst {
                let seq = self.hot_seq[i as usize];
                self.hot_seq[i as usize] += 1;
                let mode = if panic_at == Some(k) {
                    Mode::PanicOnce
                } else {
                    Mode::Normal
                };
                let work_us = self.rng.range(0, 2_000) as u32;
                let job = NewJob::new(
                    &HotJob {
                        grp,
                        seq,
                        mode,
                        work_us,
                    },
                    EnqueueOptions::group(hot_group_name(i)),
                )
                .expect("a valid job");
                batch.push((
                    job,
                    Enqueued {
                        id: 0,
                        queue: "hot",
                        grp,
                        seq,
                        mode,
                        max_attempts: HotJob::MAX_ATTEMPTS,
                    },
                ));
            }
        }
        self.enqueue(batch).await;
        true
    }

    /// SIGKILLs the hot worker while it works through a burst (between a
    /// pick and its commit, most likely), and replaces it.
    pub(crate) async fn kill_hot(&mut self) {
        self.top_up_hot().await;
        let done_sql =
            "SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded' AND queue = 'hot'";
        let before = self.monitor.scalar(done_sql).await;
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.monitor.scalar(done_sql).await == before && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if self.hot_queued().await == 0 {
            eprintln!("faults: the hot burst ended before the kill");
        }
        let victim = self.fleet.pids(Role::Hot)[0];
        let ns = self.fleet.kill(victim);
        self.seen.hot_kills.push((victim, ns));
        self.fleet.spawn(Role::Hot, HOT_GROUPS as usize).await;
    }
}

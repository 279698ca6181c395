//! The frozen-worker scenario in long mode: SIGSTOP mid-handler of a job
//! that holds its group without a transaction. Nothing on the server times
//! out (the session is idle, not in a transaction); the run's lease stops
//! being renewed, a pick of the rescuer ends the frozen session once it has
//! passed, and the pick after that runs the job again. After SIGCONT the
//! frozen run's outcome is not written (its session is gone, and its claim
//! is no longer its own).

use std::time::{Duration, Instant};

use pgfifo::{EnqueueOptions, Job, NewJob};
use pgfifo_tests::faults::runs::{self, Line, Mode};
use pgfifo_tests::records::now_ns;

use crate::jobs::{LongFreezeJob, FREEZE_LONG_GRP, LONG_LEASE, RELEASE_MARGIN};
use crate::plan::Enqueued;
use crate::processes::{signal, Role};
use crate::suite::Suite;

/// The workers' poll interval (`pgfifo_tests::worker::base_config`): a
/// pick meets the frozen group within one, ends its holder, and the next
/// one takes it over.
const POLL: Duration = Duration::from_millis(100);

impl Suite {
    /// Freezes the freezer in a long-mode job's handler and checks that its
    /// group is taken over within the lease (plus two polls), not before
    /// two thirds of it (the last renewal may have come just before the
    /// freeze), and that the frozen run never writes its outcome.
    pub(crate) async fn freeze_long(&mut self, k: usize) {
        let grp = FREEZE_LONG_GRP + k as u32;
        let group = format!("frz-long-{k}");
        let freezer = self.fleet.pids(Role::Freezer)[0];
        let job = |seq: u32, freeze: bool| {
            (
                NewJob::new(
                    &LongFreezeJob {
                        grp,
                        seq,
                        freeze,
                        work_ms: 10,
                    },
                    EnqueueOptions::group(group.clone()),
                )
                .expect("a valid job"),
                Enqueued {
                    id: 0,
                    queue: "freeze_long",
                    grp,
                    seq,
                    mode: Mode::Normal,
                    max_attempts: LongFreezeJob::MAX_ATTEMPTS,
                },
            )
        };
        let first = self.jobs.len();
        self.enqueue((0..3).map(|seq| job(seq, seq == 0)).collect())
            .await;
        let frozen_job = self.jobs[first].id;
        let ids: Vec<String> = self.jobs[first..]
            .iter()
            .map(|j| j.id.to_string())
            .collect();
        let ids = ids.join(",");

        let prefix = format!("freeze-point job={frozen_job} ");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let found = self.fleet.get(freezer).is_some_and(|p| {
                p.stdout
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|l| l.starts_with(&prefix))
            });
            if found {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the freezer never reached the freeze point of long job {frozen_job}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        signal(freezer, "STOP");
        let t_stop = now_ns();
        let held = self
            .monitor
            .scalar(&format!(
                "SELECT count(*) FROM pgfifo.job_run WHERE job_id = {frozen_job}"
            ))
            .await;
        if held != 1 {
            self.seen.failures.push(format!(
                "long job {frozen_job}: {held} run rows at SIGSTOP (expected 1)"
            ));
        }

        let rescuer = self.fleet.spawn(Role::Rescuer, 1).await;
        let bound = LONG_LEASE + 2 * POLL;
        let deadline = Instant::now() + bound + Duration::from_secs(20);
        let rerun_us = loop {
            let us = self
                .monitor
                .scalar(&format!(
                    "SELECT coalesce(max((extract(epoch FROM started_at) * 1000000)::bigint), 0) \
                     FROM pgfifo.job_attempt WHERE job_id = {frozen_job} AND attempt = 2"
                ))
                .await;
            if us > 0 {
                break us;
            }
            assert!(
                Instant::now() < deadline,
                "long job {frozen_job} was not run again after its worker froze"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let taken_over = Duration::from_nanos((rerun_us * 1_000 - t_stop).max(0) as u64);
        let deadline = Instant::now() + Duration::from_secs(30);
        let done =
            format!("SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded' AND id IN ({ids})");
        while self.monitor.scalar(&done).await != 3 {
            assert!(
                Instant::now() < deadline,
                "the long freeze scenario's jobs did not all succeed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.fleet.stop(rescuer).await;

        // Wake the frozen worker: its handler ends (or times out), and its
        // outcome is refused: its session is gone, and so is its claim.
        signal(freezer, "CONT");
        let records = self.fleet.get(freezer).expect("alive").records.clone();
        let stderr = self.fleet.get(freezer).expect("alive").stderr.clone();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = std::fs::read_to_string(&records).unwrap_or_default();
            let ended = runs::parse_all(&text).0.iter().any(
                |l| matches!(l, Line::End { run, .. } if run.job == frozen_job && run.attempt == 1),
            );
            let log = std::fs::read_to_string(&stderr).unwrap_or_default();
            let refused = log.contains("database round trip failed")
                || log.contains("taken over by another runner");
            if ended || refused {
                break;
            }
            if Instant::now() > deadline {
                self.seen.failures.push(
                    "after SIGCONT the frozen long-mode run neither ended nor had its outcome \
                     refused within 20 s"
                        .to_owned(),
                );
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let by_freezer = self
            .monitor
            .scalar(&format!(
                "SELECT count(*) FROM fault_log WHERE job_id = {frozen_job} AND pid = {freezer}"
            ))
            .await;
        let completions = self
            .monitor
            .scalar(&format!(
                "SELECT count(*) FROM fault_log WHERE job_id = {frozen_job}"
            ))
            .await;
        if by_freezer != 0 || completions != 1 {
            self.seen.failures.push(format!(
                "long job {frozen_job}: {completions} committed runs, {by_freezer} by the frozen \
                 worker (expected 1, 0)"
            ));
        }
        println!(
            "faults: frozen long-mode worker: group {group} taken over {taken_over:.2?} after \
             SIGSTOP; bound {bound:?} (long_lease {LONG_LEASE:?} + 2 polls)"
        );
        if taken_over > bound + RELEASE_MARGIN {
            self.seen.failures.push(format!(
                "frozen long-mode group taken over after {taken_over:.2?}, more than {bound:?} + \
                 {RELEASE_MARGIN:?}"
            ));
        }
        if taken_over < LONG_LEASE * 2 / 3 {
            self.seen.failures.push(format!(
                "frozen long-mode group taken over early: {taken_over:.2?} after SIGSTOP, before \
                 two thirds of the lease ({LONG_LEASE:?})"
            ));
        }
        self.seen.long_freeze = Some(taken_over);
    }
}

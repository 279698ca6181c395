//! The frozen-worker scenario: SIGSTOP mid-handler, the group's release by
//! the server, SIGCONT.

use std::time::{Duration, Instant};

use pgfifo::{EnqueueOptions, Job, NewJob};
use pgfifo_tests::faults::runs::{self, Line, Mode};
use pgfifo_tests::records::now_ns;

use crate::jobs::{FreezeJob, FREEZER_GRACE, FREEZE_GRP, FREEZE_TIMEOUT, RELEASE_MARGIN};
use crate::plan::Enqueued;
use crate::processes::{signal, Role};
use crate::suite::{FreezeReport, Suite};

impl Suite {
    /// The frozen worker: SIGSTOP mid-handler, group released by the server,
    /// the job's other run commits, SIGCONT, the frozen run does not commit,
    /// the worker carries on.
    pub(crate) async fn freeze(&mut self, k: usize) {
        let grp = FREEZE_GRP + k as u32;
        let group = format!("frz-{k}");
        let freezers = self.fleet.pids(Role::Freezer);
        assert_eq!(freezers.len(), 1, "one freezer runs");
        let freezer = freezers[0];
        let job = |seq: u32, freeze: bool| {
            (
                NewJob::new(
                    &FreezeJob {
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
                    queue: "freeze",
                    grp,
                    seq,
                    mode: Mode::Normal,
                    max_attempts: FreezeJob::MAX_ATTEMPTS,
                },
            )
        };
        let first = self.jobs.len();
        self.enqueue((0..5).map(|seq| job(seq, seq == 0)).collect())
            .await;
        let frozen_job = self.jobs[first].id;
        let behind: Vec<i64> = self.jobs[first + 1..].iter().map(|j| j.id).collect();

        // Wait for the freeze point, then stop the process there.
        let prefix = format!("freeze-point job={frozen_job} ");
        let deadline = Instant::now() + Duration::from_secs(30);
        let line = loop {
            let found = self.fleet.get(freezer).and_then(|p| {
                p.stdout
                    .lock()
                    .unwrap()
                    .iter()
                    .find(|l| l.starts_with(&prefix))
                    .cloned()
            });
            if let Some(line) = found {
                break line;
            }
            assert!(
                Instant::now() < deadline,
                "the freezer never reached the freeze point of job {frozen_job}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        signal(freezer, "STOP");
        let t_stop = now_ns();
        let field = |name: &str| -> i64 {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .and_then(|v| v.parse().ok())
                .expect("freeze-point fields")
        };
        let pre_ns = field("pre_ns=");
        let app = self.fleet.get(freezer).expect("alive").app.clone();
        // The frozen job's session: idle in its transaction since the
        // handler's last statement.
        let idle_sql = format!(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{app}' \
             AND state = 'idle in transaction' AND query LIKE 'INSERT INTO fault_log%'"
        );
        let mid_handler = self.monitor.scalar(&idle_sql).await;
        if mid_handler != 1 {
            self.seen.failures.push(format!(
                "frozen worker {app}: {mid_handler} sessions idle in transaction at SIGSTOP (expected its job's)"
            ));
        }

        // Someone else to take the group over once the server frees it.
        let rescuer = self.fleet.spawn(Role::Rescuer, 1).await;
        let bound = FREEZE_TIMEOUT + FREEZER_GRACE;
        let deadline = Instant::now() + bound + Duration::from_secs(20);
        let t_gone = loop {
            if self.monitor.scalar(&idle_sql).await == 0 {
                break now_ns();
            }
            assert!(
                Instant::now() < deadline,
                "the frozen worker's transaction was still open {:.1?} after SIGSTOP (bound {bound:?})",
                Duration::from_nanos((now_ns() - t_stop) as u64)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let done_sql = |ids: &[i64]| {
            format!(
                "SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded' AND id IN ({})",
                ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
            )
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.monitor.scalar(&done_sql(&[frozen_job])).await != 1 {
            assert!(
                Instant::now() < deadline,
                "job {frozen_job} did not succeed after its worker froze"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let rerun_us = self
            .monitor
            .scalar(&format!(
                "SELECT (extract(epoch FROM started_at) * 1000000)::bigint FROM pgfifo.job_attempt \
                 WHERE job_id = {frozen_job} AND attempt = 2"
            ))
            .await;
        let rerun_ns = rerun_us * 1_000;
        let committed_by_rescuer = self
            .monitor
            .scalar(&format!(
                "SELECT count(*) FROM fault_log WHERE job_id = {frozen_job} AND pid = {rescuer}"
            ))
            .await;
        if committed_by_rescuer != 1 {
            self.seen.failures.push(format!(
                "job {frozen_job}: {committed_by_rescuer} committed runs by the rescuer (expected 1)"
            ));
        }
        while self.monitor.scalar(&done_sql(&behind)).await != behind.len() as i64 {
            assert!(
                Instant::now() < deadline,
                "the jobs behind the frozen one did not run"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.fleet.stop(rescuer).await;

        // Wake the frozen worker: its run must not commit, and it must carry on.
        signal(freezer, "CONT");
        let records = self.fleet.get(freezer).expect("alive").records.clone();
        let stderr = self.fleet.get(freezer).expect("alive").stderr.clone();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = std::fs::read_to_string(&records).unwrap_or_default();
            let ended = runs::parse_all(&text).0.iter().any(
                |l| matches!(l, Line::End { run, .. } if run.job == frozen_job && run.attempt == 1),
            );
            let noticed = std::fs::read_to_string(&stderr)
                .unwrap_or_default()
                .contains("database round trip failed");
            if ended && noticed {
                break;
            }
            if Instant::now() > deadline {
                self.seen.failures.push(format!(
                    "after SIGCONT the frozen worker did not finish its handler and notice its lost \
                     connection within 20 s (handler ended: {ended}, noticed: {noticed})"
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let first = self.jobs.len();
        self.enqueue((5..10).map(|seq| job(seq, false)).collect())
            .await;
        let after: Vec<i64> = self.jobs[first..].iter().map(|j| j.id).collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.monitor.scalar(&done_sql(&after)).await != after.len() as i64 {
            if Instant::now() > deadline {
                self.seen
                    .failures
                    .push("the unfrozen worker did not run new jobs within 30 s".to_owned());
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let by_freezer = self
            .monitor
            .scalar(&format!(
                "SELECT count(*) FROM fault_log WHERE pid = {freezer} AND job_id IN ({})",
                after
                    .iter()
                    .map(i64::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            ))
            .await;
        if by_freezer != after.len() as i64 {
            self.seen.failures.push(format!(
                "the unfrozen worker committed {by_freezer} of the {} jobs enqueued after SIGCONT",
                after.len()
            ));
        }

        let report = FreezeReport {
            group,
            release: Duration::from_nanos((t_gone - t_stop).max(0) as u64),
            rerun_after_stop: Duration::from_nanos((rerun_ns - t_stop).max(0) as u64),
            rerun_after_last_statement: Duration::from_nanos((rerun_ns - pre_ns).max(0) as u64),
            bound,
        };
        println!(
            "faults: frozen worker {app}: group {} released {:.2?} after SIGSTOP, other run started \
             {:.2?} after SIGSTOP ({:.2?} after the frozen run's last statement); bound {:?} \
             (timeout {FREEZE_TIMEOUT:?} + idle_grace {FREEZER_GRACE:?})",
            report.group,
            report.release,
            report.rerun_after_stop,
            report.rerun_after_last_statement,
            report.bound
        );
        if report.release > bound + RELEASE_MARGIN {
            self.seen.failures.push(format!(
                "frozen group released after {:.2?}, more than {bound:?} + {RELEASE_MARGIN:?}",
                report.release
            ));
        }
        // The idle timer starts at the frozen run's last statement: the group
        // must not be released before the bound either.
        if rerun_ns < pre_ns + bound.as_nanos() as i64 - 50_000_000 {
            self.seen.failures.push(format!(
                "frozen group released early: the other run started {:.2?} after the frozen run's \
                 last statement (bound {bound:?})",
                report.rerun_after_last_statement
            ));
        }
        self.seen.freezes.push(report);
    }
}

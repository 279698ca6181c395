//! The prefetch-lane scenario: connections cut while a job waits in a
//! runner's prefetch lane.

use std::path::Path;
use std::time::{Duration, Instant};

use pgfifo::{EnqueueOptions, Job, NewJob};
use pgfifo_tests::faults::runs::{self, Line, Mode};

use crate::jobs::{FaultJob, PREFETCH_GRP};
use crate::plan::Enqueued;
use crate::processes::Role;
use crate::suite::Suite;

impl Suite {
    /// Connections cut while a job waits in a prefetch lane. A runner with
    /// one slot runs a long job of group A and has taken the head of group B
    /// ahead of its slot (picked, locked, attempt recorded), waiting for the
    /// slot. Every pgfifo connection is then terminated and another runner
    /// takes B over. When its slot frees up, the first runner must not start
    /// B's handler: its transaction, and with it B's lock, is gone.
    pub(crate) async fn prefetch_cut(&mut self, k: usize) {
        let pf = self.fleet.spawn(Role::Prefetcher, 1).await;
        let (pf_app, pf_records) = {
            let p = self.fleet.get(pf).expect("alive");
            (p.app.clone(), p.records.clone())
        };
        let grp = PREFETCH_GRP + 3 * k as u32;
        let job_of = |grp: u32, group: String, work_ms: u32| {
            (
                NewJob::new(
                    &FaultJob {
                        grp,
                        seq: 0,
                        mode: Mode::Normal,
                        work_ms,
                    },
                    EnqueueOptions::group(group).queue("prefetch"),
                )
                .expect("a valid job"),
                Enqueued {
                    id: 0,
                    queue: "prefetch",
                    grp,
                    seq: 0,
                    mode: Mode::Normal,
                    max_attempts: FaultJob::MAX_ATTEMPTS,
                },
            )
        };
        // A fresh runner's prefetch lane rests until handlers have shown
        // that they take long enough for taking jobs ahead to pay: run one
        // first, then give the lane time to wake from its rest.
        let warm = self.jobs.len();
        self.enqueue(vec![job_of(grp + 2, format!("pf-{k}-w"), 50)])
            .await;
        let warm_sql = format!(
            "SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded' AND id = {}",
            self.jobs[warm].id
        );
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.monitor.scalar(&warm_sql).await != 1 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let first = self.jobs.len();
        self.enqueue(vec![
            job_of(grp, format!("pf-{k}-a"), 1_500),
            job_of(grp + 1, format!("pf-{k}-b"), 1_500),
        ])
        .await;
        let (a, b) = (self.jobs[first].id, self.jobs[first + 1].id);
        let starts = |path: &Path, pid: u32, job: i64| -> Vec<i64> {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            runs::parse_all(&text)
                .0
                .iter()
                .filter_map(|l| match l {
                    Line::Start {
                        run, pid: p, ns, ..
                    } if run.job == job && *p == pid => Some(*ns),
                    _ => None,
                })
                .collect()
        };
        // One handler runs; the other job is taken and waits for the slot.
        let deadline = Instant::now() + Duration::from_secs(15);
        let roles = loop {
            let (sa, sb) = (
                !starts(&pf_records, pf, a).is_empty(),
                !starts(&pf_records, pf, b).is_empty(),
            );
            let recorded = self
                .monitor
                .scalar(&format!(
                    "SELECT count(*) FROM pgfifo.job_attempt WHERE job_id IN ({a}, {b})"
                ))
                .await;
            match (sa, sb, recorded) {
                (true, false, 2) => break Some((a, b)),
                (false, true, 2) => break Some((b, a)),
                (true, true, _) => break None,
                _ if Instant::now() > deadline => break None,
                _ => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        };
        let done_sql = format!(
            "SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded' AND id IN ({a}, {b})"
        );
        let Some((running, waiting)) = roles else {
            println!(
                "faults: prefetch scenario {k}: {pf_app} did not hold one job running and the other \
                 waiting for its slot (no prefetch lane?): nothing to test"
            );
            let deadline = Instant::now() + Duration::from_secs(30);
            while self.monitor.scalar(&done_sql).await != 2 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            self.fleet.stop(pf).await;
            return;
        };

        let before: Vec<u32> = self.fleet.alive.iter().map(|p| p.pid).collect();
        // The server's clock at the cut, for the attempts recorded after it.
        let cut_us = self
            .monitor
            .scalar("SELECT (extract(epoch FROM clock_timestamp()) * 1e6)::bigint")
            .await;
        let (t0, n) = self.cut_connections().await;
        let pf2 = self.fleet.spawn(Role::Prefetcher, 1).await;
        let pf2_records = self.fleet.get(pf2).expect("alive").records.clone();
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.monitor.scalar(&done_sql).await != 2 {
            assert!(
                Instant::now() < deadline,
                "the prefetch scenario's jobs did not finish after the cut"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The first runner's slot frees up when the running handler ends
        // (about 1.5 s after it began): give a late start time to show.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let text = std::fs::read_to_string(&pf_records).unwrap_or_default();
            let ended = runs::parse_all(&text)
                .0
                .iter()
                .any(|l| matches!(l, Line::End { run, .. } if run.job == running));
            if ended || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let ms = |ns: i64| (ns - t0) as f64 / 1e6;
        let after_cut: Vec<i64> = starts(&pf_records, pf, waiting)
            .into_iter()
            .filter(|&ns| ns > t0)
            .collect();
        // The first runner may take the job again after the cut, on a new
        // connection with a new lock: each such run recorded an attempt after
        // the cut. A start without one is a run on the lost lock.
        let retaken = self
            .monitor
            .scalar(&format!(
                "SELECT count(*) FROM pgfifo.job_attempt WHERE job_id = {waiting} \
                 AND runner = '{pf_app}:{pf}' AND started_at > to_timestamp({cut_us} / 1e6)"
            ))
            .await;
        let zombie: Vec<i64> = after_cut
            .iter()
            .copied()
            .skip(usize::try_from(retaken).unwrap_or(0))
            .collect();
        let other: Vec<i64> = starts(&pf2_records, pf2, waiting);
        println!(
            "faults: prefetch scenario {k}: {pf_app} ran job {running} and held job {waiting} in its \
             prefetch lane; {n} connections terminated; the other runner started job {waiting} at \
             {:?} ms; {pf_app} started it at {:?} ms (after the cut; {retaken} of them after \
             taking it again)",
            other.iter().map(|&t| ms(t).round()).collect::<Vec<_>>(),
            after_cut.iter().map(|&t| ms(t).round()).collect::<Vec<_>>()
        );
        if !zombie.is_empty() {
            self.seen.failures.push(format!(
                "LIBRARY BUG (prefetch lane): {pf_app} took job {waiting} into its prefetch lane, every \
                 pgfifo connection was terminated, another runner started the job {:?} ms later, and \
                 {pf_app} still started the job's handler {:?} ms after the cut, without its lock, \
                 when its slot freed up",
                other.iter().map(|&t| ms(t).round()).collect::<Vec<_>>(),
                zombie.iter().map(|&t| ms(t).round()).collect::<Vec<_>>()
            ));
        }
        self.recover(t0, &before, "terminate (prefetch lane)").await;
        self.fleet.stop(pf).await;
        self.fleet.stop(pf2).await;
    }
}

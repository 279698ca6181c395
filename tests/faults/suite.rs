//! The run's state and its steps: enqueueing waves, kills, terminations,
//! restarts and the recovery check after each database fault.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use diesel_async::{AsyncConnection, AsyncPgConnection};
use pgfifo::{EnqueueOptions, NewJob};
use pgfifo_tests::faults::private_pg::{PrivatePg, StopMode};
use pgfifo_tests::faults::rng::Rng;
use pgfifo_tests::faults::runs::{DbFault, Mode};
use pgfifo_tests::records::now_ns;

use crate::jobs::{FaultJob, LongFaultJob, APP_PREFIX, FAULT_TIMEOUT};
use crate::monitor::{us, Monitor};
use crate::plan::{group_name, is_long_group, max_attempts, Enqueued, Plan, RETRYING_IN_WIDE};
use crate::processes::{in_flight_since, Fleet, Role};

// --- The run ----------------------------------------------------------------

/// Everything the suite observed, for the checks and the summary.
#[derive(Default)]
pub(crate) struct Observed {
    pub(crate) kills: Vec<(u32, i64)>,
    /// SIGKILLs of the hot worker (`hot.rs`): its pid and when.
    pub(crate) hot_kills: Vec<(u32, i64)>,
    pub(crate) terminations: usize,
    pub(crate) terminated_backends: i64,
    pub(crate) restarts: usize,
    pub(crate) db_faults: Vec<DbFault>,
    pub(crate) reconnect_failures: Vec<String>,
    pub(crate) recoveries: Vec<String>,
    pub(crate) freezes: Vec<FreezeReport>,
    /// The long-mode freeze: SIGSTOP to the start of the job's other run.
    pub(crate) long_freeze: Option<Duration>,
    pub(crate) failures: Vec<String>,
}

#[derive(Debug)]
pub(crate) struct FreezeReport {
    pub(crate) group: String,
    /// SIGSTOP to the frozen session's end (group free).
    pub(crate) release: Duration,
    /// SIGSTOP to the start of the job's other run.
    pub(crate) rerun_after_stop: Duration,
    /// The frozen run's last statement to the start of the other run.
    pub(crate) rerun_after_last_statement: Duration,
    pub(crate) bound: Duration,
}

pub(crate) struct Suite {
    pub(crate) plan: Plan,
    pub(crate) rng: Rng,
    pub(crate) url: String,
    pub(crate) monitor: Monitor,
    pub(crate) fleet: Fleet,
    pub(crate) jobs: Vec<Enqueued>,
    pub(crate) next_seq: Vec<u32>,
    pub(crate) specials: Vec<Mode>,
    pub(crate) special_groups: HashSet<u32>,
    /// The groups of the `faults` queue that run several jobs at once, and
    /// their N (`plan::wide_groups`).
    pub(crate) wide: BTreeMap<u32, u32>,
    /// Jobs that fail an attempt, then succeed, put in those groups so far.
    pub(crate) retrying_in_wide: usize,
    pub(crate) waves: usize,
    /// The next `seq` of each hot group (`hot.rs`).
    pub(crate) hot_seq: Vec<u32>,
    /// The planned panics still to go into hot groups.
    pub(crate) hot_specials: Vec<Mode>,
    pub(crate) seen: Observed,
}

impl Suite {
    /// How many runs of group `grp` may go at once (its N).
    pub(crate) fn limit_of(&self, grp: u32) -> usize {
        self.wide.get(&grp).map_or(1, |&n| n as usize)
    }

    pub(crate) async fn enqueue(&mut self, batch: Vec<(NewJob, Enqueued)>) {
        let mut conn = AsyncPgConnection::establish(&format!(
            "{}?application_name=pgfifo-faults-enqueue",
            self.url
        ))
        .await
        .expect("connect to enqueue");
        for chunk in batch.chunks(500) {
            let ids = pgfifo::enqueue_batch(&mut conn, chunk.iter().map(|(j, _)| j.clone()))
                .await
                .expect("enqueue a batch");
            for (id, (_, e)) in ids.into_iter().zip(chunk) {
                self.jobs.push(Enqueued { id, ..e.clone() });
            }
        }
    }

    /// A wave of `n` jobs over random groups, with the next special jobs.
    pub(crate) fn wave(&mut self, n: usize) -> Vec<(NewJob, Enqueued)> {
        self.waves += 1;
        // Specials go out over the first waves (CI: all in the first), each in
        // a group of its own among the specials, with normal jobs around it.
        let per_wave = if self.plan.soak {
            self.specials.len().div_ceil(8).max(1)
        } else {
            self.specials.len()
        };
        let take = per_wave.min(self.specials.len());
        let mut modes: Vec<Mode> = self.specials.drain(..take).collect();
        modes.resize(n.max(modes.len()), Mode::Normal);
        self.rng.shuffle(&mut modes);
        let mut out = Vec::with_capacity(modes.len());
        for mode in modes {
            // The first few jobs that fail an attempt and then succeed go
            // into groups of N > 1, where they hold back the jobs behind.
            let into_wide = matches!(mode, Mode::HangOnce | Mode::PanicOnce)
                && self.retrying_in_wide < RETRYING_IN_WIDE
                && self.wide.keys().any(|g| !self.special_groups.contains(g));
            let grp = loop {
                let g = if into_wide {
                    let wide: Vec<u32> = self.wide.keys().copied().collect();
                    wide[self.rng.below(wide.len())]
                } else {
                    self.rng.below(self.plan.groups as usize) as u32
                };
                if mode == Mode::Normal
                    || (self.special_groups.len() >= self.plan.groups as usize)
                    || self.special_groups.insert(g)
                {
                    break g;
                }
            };
            if into_wide {
                self.retrying_in_wide += 1;
            }
            let seq = self.next_seq[grp as usize];
            self.next_seq[grp as usize] += 1;
            let work_ms = self.rng.range(
                u64::from(self.plan.work_ms.0),
                u64::from(self.plan.work_ms.1),
            ) as u32;
            let attempts = max_attempts(mode);
            let options = EnqueueOptions::group(group_name(grp)).max_attempts(attempts);
            let job = if is_long_group(grp, &self.wide) {
                NewJob::new(
                    &LongFaultJob {
                        grp,
                        seq,
                        mode,
                        work_ms,
                    },
                    options,
                )
            } else {
                NewJob::new(
                    &FaultJob {
                        grp,
                        seq,
                        mode,
                        work_ms,
                    },
                    options,
                )
            }
            .expect("a valid job");
            out.push((
                job,
                Enqueued {
                    id: 0,
                    queue: "faults",
                    grp,
                    seq,
                    mode,
                    max_attempts: attempts,
                },
            ));
        }
        out
    }

    pub(crate) fn fault_jobs(&self) -> usize {
        self.jobs.iter().filter(|j| j.queue == "faults").count()
    }

    /// Keeps a backlog so that kills always find handlers running, and
    /// gives the hot groups a burst (`hot.rs`).
    pub(crate) async fn top_up(&mut self) {
        self.top_up_hot().await;
        if self.fault_jobs() >= self.plan.max_jobs {
            return;
        }
        let queued = self
            .monitor
            .scalar("SELECT count(*) FROM pgfifo.job WHERE state = 'queued' AND queue = 'faults'")
            .await;
        if queued < self.plan.backlog {
            let n = self.plan.wave.min(self.plan.max_jobs - self.fault_jobs());
            let batch = self.wave(n);
            self.enqueue(batch).await;
        }
    }

    /// Waits `d`, replacing dead workers meanwhile.
    pub(crate) async fn pause(&mut self, d: Duration) {
        let until = Instant::now() + d;
        loop {
            self.fleet.supervise(self.plan.concurrency).await;
            let now = Instant::now();
            if now >= until {
                return;
            }
            tokio::time::sleep((until - now).min(Duration::from_millis(100))).await;
        }
    }

    /// SIGKILLs a random worker that has a handler running, and replaces it.
    pub(crate) async fn kill_one(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        let victim = loop {
            self.fleet.supervise(self.plan.concurrency).await;
            let since = now_ns() - FAULT_TIMEOUT.as_nanos() as i64;
            let busy: Vec<u32> = self
                .fleet
                .alive
                .iter()
                .filter(|p| p.role == Role::Worker && in_flight_since(&p.records, since) > 0)
                .map(|p| p.pid)
                .collect();
            if !busy.is_empty() {
                break busy[self.rng.below(busy.len())];
            }
            if Instant::now() > deadline {
                let all = self.fleet.pids(Role::Worker);
                eprintln!("faults: no worker has a handler running; killing one anyway");
                break all[self.rng.below(all.len())];
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let ns = self.fleet.kill(victim);
        self.seen.kills.push((victim, ns));
        self.fleet.spawn(Role::Worker, self.plan.concurrency).await;
    }

    /// Terminates every pgfifo connection of every worker process.
    pub(crate) async fn terminate_all(&mut self) {
        let before: Vec<u32> = self.fleet.alive.iter().map(|p| p.pid).collect();
        let (t0, n) = self.cut_connections().await;
        println!("faults: terminated {n} pgfifo connections");
        self.recover(t0, &before, "terminate").await;
    }

    /// Terminates every pgfifo connection and waits until each is gone;
    /// records the fault. Returns when it began and how many were cut.
    pub(crate) async fn cut_connections(&mut self) -> (i64, i64) {
        let t0 = now_ns();
        let n = self
            .monitor
            .scalar(&format!(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE application_name LIKE '{APP_PREFIX}%'"
            ))
            .await;
        self.seen.terminations += 1;
        self.seen.terminated_backends += n;
        // Every connection that existed then is gone.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = self
                .monitor
                .scalar(&format!(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE '{APP_PREFIX}%' \
                     AND (extract(epoch FROM backend_start) * 1000000)::bigint < {}",
                    us(t0)
                ))
                .await;
            if left == 0 {
                break;
            }
            if Instant::now() > deadline {
                self.seen.failures.push(format!(
                    "{left} pgfifo connections survived pg_terminate_backend"
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.seen.db_faults.push(DbFault {
            begin: t0,
            end: now_ns(),
        });
        (t0, n)
    }

    /// A full PostgreSQL restart.
    pub(crate) async fn restart(&mut self, pg: &mut PrivatePg, mode: StopMode) {
        let before: Vec<u32> = self.fleet.alive.iter().map(|p| p.pid).collect();
        let t0 = now_ns();
        let down = pg.restart(mode).expect("restart PostgreSQL");
        self.monitor.conn = None;
        self.seen.db_faults.push(DbFault {
            begin: t0,
            end: now_ns(),
        });
        self.seen.restarts += 1;
        println!("faults: PostgreSQL restarted ({mode:?}), unavailable for {down:.2?}");
        self.recover(t0, &before, "restart").await;
    }

    /// After a database fault at `t0`: every process that was alive then
    /// (and still is) reconnects by itself, and every such normal or hot
    /// worker commits a job again (the hot groups get a burst if they have
    /// little left).
    pub(crate) async fn recover(&mut self, t0: i64, before: &[u32], what: &str) {
        self.top_up_hot().await;
        let began = Instant::now();
        let deadline = began + Duration::from_secs(40);
        loop {
            self.fleet.supervise(self.plan.concurrency).await;
            let mut missing = Vec::new();
            let alive: Vec<(u32, String, Role)> = self
                .fleet
                .alive
                .iter()
                .filter(|p| before.contains(&p.pid))
                .map(|p| (p.pid, p.app.clone(), p.role))
                .collect();
            for (pid, app, role) in alive {
                let connected = self
                    .monitor
                    .scalar(&format!(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{app}' \
                         AND (extract(epoch FROM backend_start) * 1000000)::bigint > {}",
                        us(t0)
                    ))
                    .await;
                let committed = if matches!(role, Role::Worker | Role::Hot) {
                    self.monitor
                        .scalar(&format!(
                            "SELECT count(*) FROM fault_log WHERE pid = {pid} AND start_ns > {t0}"
                        ))
                        .await
                } else {
                    1
                };
                if connected == 0 || committed == 0 {
                    missing.push(format!(
                        "{app} (pid {pid}): reconnected={} committed_since={}",
                        connected > 0,
                        committed > 0
                    ));
                }
            }
            if missing.is_empty() {
                let line = format!(
                    "{what}: every runner reconnected and carried on within {:.2?}",
                    began.elapsed()
                );
                println!("faults: {line}");
                self.seen.recoveries.push(line);
                return;
            }
            if Instant::now() > deadline {
                for m in missing {
                    self.seen
                        .reconnect_failures
                        .push(format!("after {what}: {m}"));
                }
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

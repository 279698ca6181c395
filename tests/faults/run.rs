//! The suite's run (the `faults_suite` test): setup, the fault schedule, the
//! drain, the checks of every job and run, the summary line.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::time::{Duration, Instant};

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use pgfifo_tests::faults::private_pg::{PrivatePg, StopMode};
use pgfifo_tests::faults::runs::{self, Cut, Line, Mode, Rng};
use pgfifo_tests::records::now_ns;

use crate::jobs::{FAULT_LOG, FAULT_TIMEOUT, FREEZE_TIMEOUT};
use crate::monitor::{log_line_ns, AttemptCount, AttemptRow, JobRow, LogRow, Monitor};
use crate::plan::{reason_fits, Plan, Step};
use crate::processes::{Cause, Fleet, Role};
use crate::suite::{Observed, Suite};

/// Everything the `faults_suite` test does.
pub(crate) async fn faults_suite() {
    let began = Instant::now();
    let plan = Plan::from_env();
    println!(
        "faults: {} mode, seed {} (FAULTS_SEED={} replays it)",
        if plan.soak { "soak" } else { "CI" },
        plan.seed,
        plan.seed
    );
    let mut pg = PrivatePg::start().expect("start a private PostgreSQL");
    println!(
        "faults: private PostgreSQL on port {} in {}",
        pg.port(),
        pg.root().display()
    );
    let run_dir = pg.root().join("run");
    std::fs::create_dir_all(&run_dir).expect("create the run directory");
    {
        let mut admin = AsyncPgConnection::establish(&pg.url("postgres"))
            .await
            .expect("connect to the private server");
        admin
            .batch_execute("CREATE DATABASE faults")
            .await
            .expect("create the database");
    }
    let url = pg.url("faults");
    {
        let mut conn = AsyncPgConnection::establish(&url).await.expect("connect");
        pgfifo::migrate::migrate_conn(&mut conn)
            .await
            .expect("migrate");
        conn.batch_execute(FAULT_LOG)
            .await
            .expect("create fault_log");
    }

    let mut suite = Suite {
        rng: Rng::new(plan.seed),
        monitor: Monitor::new(&url),
        fleet: Fleet::new(run_dir.clone(), url.clone()),
        url: url.clone(),
        jobs: Vec::new(),
        next_seq: vec![0; plan.groups as usize],
        specials: plan.specials(),
        special_groups: HashSet::new(),
        waves: 0,
        seen: Observed::default(),
        plan: plan.clone(),
    };
    for _ in 0..plan.workers {
        suite.fleet.spawn(Role::Worker, plan.concurrency).await;
    }
    suite.fleet.spawn(Role::Freezer, 1).await;

    // The fault schedule: kills first (the poison job goes off meanwhile),
    // the rest spread at random.
    let mut steps: Vec<Step> = Vec::new();
    steps.extend(std::iter::repeat_n(Step::Kill, plan.kills));
    steps.extend(std::iter::repeat_n(Step::Terminate, plan.terminations));
    for i in 0..plan.restarts {
        let mode = if i % 2 == 1 {
            StopMode::Immediate
        } else {
            StopMode::Fast
        };
        steps.push(Step::Restart(mode));
    }
    steps.extend(std::iter::repeat_n(Step::Freeze, plan.freezes));
    steps.extend(std::iter::repeat_n(Step::PrefetchCut, plan.prefetch_cuts));
    suite.rng.shuffle(&mut steps[..]);
    let first_other = steps.iter().position(|s| *s != Step::Kill).unwrap_or(0);
    if first_other < 2 {
        let kill = steps.iter().rposition(|s| *s == Step::Kill).expect("kills");
        steps.swap(first_other, kill);
        if let Some(again) = steps.iter().position(|s| *s != Step::Kill) {
            if again < 2 {
                let kill = steps.iter().rposition(|s| *s == Step::Kill).expect("kills");
                steps.swap(again, kill);
            }
        }
    }

    let first_wave = suite.wave(plan.wave);
    suite.enqueue(first_wave).await;
    let chaos = Instant::now();
    let mut freezes = 0;
    let mut prefetch_cuts = 0;
    for (i, step) in steps.iter().enumerate() {
        let pause = suite.rng.range(plan.step_ms.0, plan.step_ms.1);
        suite.pause(Duration::from_millis(pause)).await;
        suite.top_up().await;
        match *step {
            Step::Kill => suite.kill_one().await,
            Step::Terminate => suite.terminate_all().await,
            Step::Restart(mode) => suite.restart(&mut pg, mode).await,
            Step::Freeze => {
                suite.freeze(freezes).await;
                freezes += 1;
            }
            Step::PrefetchCut => {
                suite.prefetch_cut(prefetch_cuts).await;
                prefetch_cuts += 1;
            }
        }
        if plan.soak && i % 25 == 24 {
            println!(
                "faults: {} of {} steps after {:.0?}, {} jobs enqueued",
                i + 1,
                steps.len(),
                began.elapsed(),
                suite.jobs.len()
            );
        }
    }
    let chaos = chaos.elapsed();

    // Drain: the remaining jobs, then everything to a final state.
    while suite.fault_jobs() < plan.min_jobs {
        let n = plan.wave.min(plan.min_jobs - suite.fault_jobs());
        let batch = suite.wave(n);
        suite.enqueue(batch).await;
    }
    let drain = Instant::now();
    let drained = loop {
        suite.fleet.supervise(plan.concurrency).await;
        let queued = suite
            .monitor
            .scalar("SELECT count(*) FROM pgfifo.job WHERE state = 'queued'")
            .await;
        if queued == 0 {
            break true;
        }
        if drain.elapsed() > plan.drain_limit {
            eprintln!(
                "faults: {queued} jobs still queued {:?} after the faults ended",
                plan.drain_limit
            );
            break false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let drain = drain.elapsed();
    let survivors: Vec<u32> = suite.fleet.alive.iter().map(|p| p.pid).collect();
    for pid in survivors {
        suite.fleet.stop(pid).await;
    }

    // --- The checks -------------------------------------------------------
    let mut conn = AsyncPgConnection::establish(&url).await.expect("connect");
    let job_rows: Vec<JobRow> = diesel::sql_query(
        "SELECT id, state, attempts, coalesce(last_error, '') AS last_error FROM pgfifo.job",
    )
    .load(&mut conn)
    .await
    .expect("load jobs");
    let log: Vec<LogRow> =
        diesel::sql_query("SELECT job_id, attempt, grp, seq, pid, start_ns, end_ns FROM fault_log")
            .load(&mut conn)
            .await
            .expect("load fault_log");
    let attempt_counts: Vec<AttemptCount> =
        diesel::sql_query("SELECT job_id, count(*) AS n FROM pgfifo.job_attempt GROUP BY job_id")
            .load(&mut conn)
            .await
            .expect("load attempts");
    let attempt_rows: Vec<AttemptRow> = diesel::sql_query(
        "SELECT job_id, attempt, runner, \
         (extract(epoch FROM started_at) * 1000000)::bigint AS started_us, \
         coalesce(error, '') AS error FROM pgfifo.job_attempt",
    )
    .load(&mut conn)
    .await
    .expect("load attempt rows");
    let hang_timeouts = suite
        .monitor
        .scalar("SELECT count(*) FROM pgfifo.job_attempt WHERE error LIKE '%timed out%'")
        .await;
    let panics = suite
        .monitor
        .scalar("SELECT count(*) FROM pgfifo.job_attempt WHERE error LIKE '%panicked%'")
        .await;
    drop(conn);

    let state: HashMap<i64, &JobRow> = job_rows.iter().map(|r| (r.id, r)).collect();
    let attempts_of: HashMap<i64, i64> = attempt_counts.iter().map(|a| (a.job_id, a.n)).collect();
    let mut logs_of: HashMap<i64, Vec<&LogRow>> = HashMap::new();
    for row in &log {
        logs_of.entry(row.job_id).or_default().push(row);
    }
    let mut lost = Vec::new();
    let mut duplicates = 0usize;
    let mut wrong_outcome = Vec::new();
    let mut failed_as_expected = 0usize;
    let enqueued_ids: HashSet<i64> = suite.jobs.iter().map(|j| j.id).collect();
    for job in &suite.jobs {
        let committed = logs_of.get(&job.id).map_or(0, Vec::len);
        duplicates += committed.saturating_sub(1);
        let Some(row) = state.get(&job.id) else {
            lost.push(format!("job {} is missing from pgfifo.job", job.id));
            continue;
        };
        if job.mode.succeeds() {
            match (row.state.as_str(), committed) {
                ("succeeded", 1..) => {
                    let run = logs_of[&job.id][0];
                    if run.attempt != row.attempts {
                        wrong_outcome.push(format!(
                            "job {}: committed run is attempt {}, the job says {}",
                            job.id, run.attempt, row.attempts
                        ));
                    }
                }
                ("queued", _) => lost.push(format!(
                    "job {} ({:?}, group {} seq {}) never finished",
                    job.id, job.mode, job.grp, job.seq
                )),
                ("succeeded", 0) => lost.push(format!(
                    "job {} succeeded without its handler's committed write",
                    job.id
                )),
                (other, _) => wrong_outcome.push(format!(
                    "job {} ({:?}) ended {other}: {}",
                    job.id, job.mode, row.last_error
                )),
            }
        } else {
            let attempts = attempts_of.get(&job.id).copied().unwrap_or(0);
            if row.state == "queued" {
                lost.push(format!(
                    "job {} ({:?}, group {} seq {}) never finished",
                    job.id, job.mode, job.grp, job.seq
                ));
            } else if row.state != "failed" || committed > 0 {
                wrong_outcome.push(format!(
                    "job {} ({:?}) ended {} with {committed} committed runs",
                    job.id, job.mode, row.state
                ));
            } else if !reason_fits(job.mode, &row.last_error) {
                wrong_outcome.push(format!(
                    "job {} ({:?}) failed with an unexpected reason: {:?}",
                    job.id, job.mode, row.last_error
                ));
            } else if job.mode == Mode::Poison && attempts < i64::from(job.max_attempts) {
                wrong_outcome.push(format!(
                    "poison job {} failed after {attempts} recorded attempts of {}",
                    job.id, job.max_attempts
                ));
            } else {
                failed_as_expected += 1;
                println!(
                    "faults: job {} ({:?}) failed as it must after {attempts} attempts: {}",
                    job.id, job.mode, row.last_error
                );
            }
        }
    }
    let strangers = log
        .iter()
        .filter(|r| !enqueued_ids.contains(&r.job_id))
        .count();
    if strangers > 0 {
        wrong_outcome.push(format!("{strangers} fault_log rows of jobs never enqueued"));
    }

    // Committed runs: per group, in order and never overlapping.
    let mut committed_by_group: BTreeMap<i32, Vec<&LogRow>> = BTreeMap::new();
    for row in &log {
        committed_by_group.entry(row.grp).or_default().push(row);
    }
    let mut order_violations = Vec::new();
    let mut overlaps = Vec::new();
    for (grp, rows) in &mut committed_by_group {
        rows.sort_by_key(|r| (r.start_ns, r.job_id));
        for pair in rows.windows(2) {
            if pair[1].seq <= pair[0].seq {
                order_violations.push(format!(
                    "group {grp}: committed seq {} (job {}) started after seq {} (job {})",
                    pair[1].seq, pair[1].job_id, pair[0].seq, pair[0].job_id
                ));
            }
            if pair[1].start_ns <= pair[0].end_ns {
                overlaps.push(format!(
                    "group {grp}: committed job {} (pid {}) started before job {} (pid {}) ended",
                    pair[1].job_id, pair[1].pid, pair[0].job_id, pair[0].pid
                ));
            }
        }
    }
    // Every run, committed or not, from the workers' records.
    let mut lines = Vec::new();
    let mut torn = 0usize;
    for (_, path) in &suite.fleet.records {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let (mut l, bad) = runs::parse_all(&text);
        torn += bad.len();
        lines.append(&mut l);
    }
    let mut ctx = runs::Context {
        db_faults: suite.seen.db_faults.clone(),
        ..runs::Context::default()
    };
    for d in &suite.fleet.deaths {
        if matches!(d.cause, Cause::Killed | Cause::Poison) {
            ctx.deaths.insert(d.pid, d.ns);
        }
    }
    for job in &suite.jobs {
        let timeout = if job.queue == "freeze" {
            FREEZE_TIMEOUT
        } else {
            FAULT_TIMEOUT
        };
        ctx.timeout_ns.insert(job.id, timeout.as_nanos() as i64);
    }
    let intervals = runs::intervals(&lines, &ctx);
    // Evidence for an overlap: when each run's attempt was recorded (after
    // its pick, before its handler), its handler's span and how it ended, in
    // seconds since the run began, next to the database faults.
    let t_base = now_ns() - began.elapsed().as_nanos() as i64;
    let secs = |ns: i64| (ns - t_base) as f64 / 1e9;
    let attempt_info: HashMap<(i64, i32), &AttemptRow> = attempt_rows
        .iter()
        .map(|a| ((a.job_id, a.attempt), a))
        .collect();
    let end_text: HashMap<(u32, u64), String> = lines
        .iter()
        .filter_map(|l| match l {
            Line::End {
                pid, n, outcome, ..
            } => Some(((*pid, *n), outcome.clone())),
            _ => None,
        })
        .collect();
    let describe = |i: &runs::Interval| {
        let recorded = attempt_info.get(&(i.run.job, i.run.attempt as i32)).map_or(
            "no attempt row".to_owned(),
            |a| {
                format!(
                    "attempt recorded at {:.3}s by {}{}",
                    secs(a.started_us * 1_000),
                    a.runner,
                    if a.error.is_empty() {
                        String::new()
                    } else {
                        format!(" (attempt error: {})", a.error)
                    }
                )
            },
        );
        format!(
            "[job {} attempt {} pid {}: {recorded}; handler {:.3}s..{:.3}s ({:?}, {})]",
            i.run.job,
            i.run.attempt,
            i.pid,
            secs(i.start),
            secs(i.end),
            i.cut,
            end_text
                .get(&(i.pid, i.n))
                .map_or("no end line", String::as_str)
        )
    };
    let fault_times: Vec<String> = suite
        .seen
        .db_faults
        .iter()
        .map(|&t| format!("{:.3}s", secs(t)))
        .collect();
    for (a, b) in runs::overlaps(&intervals) {
        overlaps.push(format!(
            "group {}: {} started while {} ran (database faults at {})",
            b.grp,
            describe(&b),
            describe(&a),
            fault_times.join(", ")
        ));
    }
    for (a, b) in runs::order_violations(&intervals) {
        order_violations.push(format!(
            "group {}: seq {} (run {:?}) started after seq {} (run {:?})",
            b.grp, b.seq, b.run, a.seq, a.run
        ));
    }
    let mid_handler_kills = suite
        .seen
        .kills
        .iter()
        .filter(|(pid, _)| {
            intervals
                .iter()
                .any(|i| i.pid == *pid && i.cut == Cut::Died)
        })
        .count();
    let interrupted = intervals.iter().filter(|i| i.cut == Cut::Died).count();
    // How soon a cut-off job ran again: from its process's death (or the
    // database fault) to the start of its next attempt's handler. This bounds
    // how long the group stayed held (plus the time to pick and start).
    let mut next_start: HashMap<(i64, u32), i64> = HashMap::new();
    for i in &intervals {
        next_start.insert((i.run.job, i.run.attempt), i.start);
    }
    let rerun_delays = |cut: Cut| -> Vec<f64> {
        let mut v: Vec<f64> = intervals
            .iter()
            .filter(|i| i.cut == cut)
            .filter_map(|i| {
                (i.run.attempt + 1..i.run.attempt + 4)
                    .find_map(|a| next_start.get(&(i.run.job, a)))
                    .map(|&next| (next - i.end) as f64 / 1e6)
            })
            .collect();
        v.sort_by(f64::total_cmp);
        v
    };
    // When the server ended each killed process's transactions (its log
    // has a line per session, with the application name): the group release.
    let server_log = pg.log_text();
    let mut kill_release: Vec<f64> = suite
        .fleet
        .deaths
        .iter()
        .filter(|d| matches!(d.cause, Cause::Killed | Cause::Poison))
        .filter_map(|d| {
            server_log
                .lines()
                .filter(|l| {
                    l.contains(&format!(
                        "] {} LOG:  unexpected EOF on client connection",
                        d.app
                    ))
                })
                .filter_map(log_line_ns)
                .filter(|&t| t >= d.ns - 5_000_000 && t < d.ns + 10_000_000_000)
                .max()
                .map(|t| (t - d.ns) as f64 / 1e6)
        })
        .collect();
    kill_release.sort_by(f64::total_cmp);
    if !kill_release.is_empty() {
        println!(
            "faults: process killed or aborted -> the server ended its open transactions after: \
             median {:.0} ms, max {:.0} ms ({} processes, from the server log)",
            kill_release[kill_release.len() / 2],
            kill_release[kill_release.len() - 1],
            kill_release.len()
        );
    }
    for (cut, what) in [
        (Cut::Died, "process killed or aborted"),
        (Cut::DatabaseFault, "connections cut or database restarted"),
    ] {
        let v = rerun_delays(cut);
        if !v.is_empty() {
            println!(
                "faults: {what} -> the cut-off job's next run started after (includes waiting \
                 for a free lane under load): median {:.0} ms, p90 {:.0} ms, max {:.0} ms ({} runs)",
                v[v.len() / 2],
                v[v.len() * 9 / 10],
                v[v.len() - 1],
                v.len()
            );
        }
    }
    let poison_aborts = suite
        .fleet
        .deaths
        .iter()
        .filter(|d| d.cause == Cause::Poison)
        .count();
    let unexpected: Vec<String> = suite
        .fleet
        .unexpected()
        .iter()
        .map(|d| format!("{} ({:?}, pid {}): {:?}", d.app, d.role, d.pid, d.cause))
        .collect();
    let groups_used = suite
        .jobs
        .iter()
        .filter(|j| j.queue == "faults")
        .map(|j| j.grp)
        .collect::<HashSet<_>>()
        .len();
    let frozen_release = suite
        .seen
        .freezes
        .iter()
        .map(|f| f.release)
        .max()
        .unwrap_or_default();

    // --- Report -------------------------------------------------------------
    for r in &suite.seen.recoveries {
        println!("faults: {r}");
    }
    let show = |what: &str, items: &[String]| {
        for item in items.iter().take(20) {
            println!("faults: {what}: {item}");
        }
        if items.len() > 20 {
            println!("faults: {what}: … and {} more", items.len() - 20);
        }
    };
    show("LOST", &lost);
    show("WRONG OUTCOME", &wrong_outcome);
    show("ORDER VIOLATION", &order_violations);
    show("OVERLAP", &overlaps);
    show("UNEXPECTED EXIT", &unexpected);
    show("RECONNECT FAILURE", &suite.seen.reconnect_failures);
    show("FAILED CHECK", &suite.seen.failures);
    println!(
        "faults: {} processes started, {} handler runs recorded ({interrupted} cut off by a kill or \
         abort), {} pgfifo connections terminated, chaos {chaos:.1?}, drain {drain:.1?}",
        suite.fleet.records.len(),
        intervals.len(),
        suite.seen.terminated_backends
    );
    let summary = format!(
        "jobs={} groups={groups_used} kills={} mid_handler_kills={mid_handler_kills} restarts={} \
         terminations={} frozen={} frozen_release={:.2}s poison_aborts={poison_aborts} \
         hang_timeouts={hang_timeouts} panics={panics} failed_as_expected={failed_as_expected} \
         lost={} duplicates={duplicates} order_violations={} overlaps={} wrong_outcomes={} \
         unexpected_exits={} reconnect_failures={} failed_checks={} torn_records={torn} duration={:.0}s",
        suite.jobs.len(),
        suite.seen.kills.len(),
        suite.seen.restarts,
        suite.seen.terminations,
        suite.seen.freezes.len(),
        frozen_release.as_secs_f64(),
        lost.len(),
        order_violations.len(),
        overlaps.len(),
        wrong_outcome.len(),
        unexpected.len(),
        suite.seen.reconnect_failures.len(),
        suite.seen.failures.len(),
        began.elapsed().as_secs_f64(),
    );
    println!("{summary}");
    let _ = std::io::stdout().flush();

    let mut problems = Vec::new();
    let mut need = |ok: bool, what: String| {
        if !ok {
            problems.push(what);
        }
    };
    need(drained, "jobs still queued at the end".to_owned());
    need(lost.is_empty(), format!("lost={}", lost.len()));
    need(duplicates == 0, format!("duplicates={duplicates}"));
    need(
        order_violations.is_empty(),
        format!("order_violations={}", order_violations.len()),
    );
    need(overlaps.is_empty(), format!("overlaps={}", overlaps.len()));
    need(
        wrong_outcome.is_empty(),
        format!("wrong_outcomes={}", wrong_outcome.len()),
    );
    need(
        unexpected.is_empty(),
        format!("unexpected_exits={}", unexpected.len()),
    );
    need(
        suite.seen.reconnect_failures.is_empty(),
        format!("reconnect_failures={}", suite.seen.reconnect_failures.len()),
    );
    need(
        suite.seen.failures.is_empty(),
        format!("failed_checks={}", suite.seen.failures.len()),
    );
    need(torn == 0, format!("torn_records={torn}"));
    // The minimums.
    need(
        suite.jobs.len() >= plan.min_jobs,
        format!("only {} jobs", suite.jobs.len()),
    );
    need(groups_used >= 100, format!("only {groups_used} groups"));
    need(
        mid_handler_kills >= plan.kills.min(20),
        format!("only {mid_handler_kills} kills hit a running handler"),
    );
    need(
        suite.seen.terminations >= 1 && suite.seen.restarts >= 1,
        "no database fault".to_owned(),
    );
    need(
        suite.seen.freezes.len() >= plan.freezes,
        "no frozen worker".to_owned(),
    );
    need(
        poison_aborts >= plan.poison,
        format!("poison_aborts={poison_aborts}"),
    );
    need(
        hang_timeouts >= (plan.hang_once as i64).max(1)
            && panics >= (plan.panic_once as i64).max(1),
        format!(
            "hang_timeouts={hang_timeouts} panics={panics}: too few handlers timed out or panicked"
        ),
    );
    need(
        failed_as_expected == plan.poison + plan.hang_always + plan.panic_always,
        format!("failed_as_expected={failed_as_expected}"),
    );
    if !problems.is_empty() {
        pg.keep_files();
        panic!(
            "fault-injection suite failed: {}; worker logs and records in {}",
            problems.join(", "),
            run_dir.display()
        );
    }
}

//! The suite's run (the `faults_suite` test): setup, the fault schedule, the
//! drain; then the checks of every job and run and the summary line
//! (`checks.rs`, `report.rs`).

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use pgfifo_tests::faults::private_pg::{PrivatePg, StopMode};
use pgfifo_tests::faults::rng::Rng;
use pgfifo_tests::faults::runs::Mode;

use crate::checks;
use crate::jobs::{FAULT_HOT, FAULT_LOG, FAULT_LONG, FAULT_TRACE, HOT_GROUPS};
use crate::monitor::Monitor;
use crate::plan::{self, Plan, Step};
use crate::processes::{Fleet, Role};
use crate::report::{self, Timing};
use crate::suite::{Observed, Suite};
use crate::wide::set_limits;

/// Everything the `faults_suite` test does.
pub(crate) async fn faults_suite() {
    let began = Instant::now();
    let plan = Plan::from_env();
    let wide = plan::wide_groups(&plan);
    let (mut pg, run_dir, url) = start_server(&plan, &wide).await;
    let mut suite = start_fleet(&plan, wide, &run_dir, &url).await;
    let steps = schedule(&plan, &mut suite.rng);
    let chaos = inject_faults(&mut suite, &mut pg, &plan, &steps, began).await;
    let (drained, drain) = drain(&mut suite, &plan).await;

    let found = checks::check(&mut suite, &pg, &url, began).await;
    let problems = report::report(
        &suite,
        &plan,
        found,
        Timing {
            began,
            chaos,
            drain,
            drained,
        },
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

/// Prints the plan, starts the private server and creates the migrated
/// `faults` database with its `fault_log` and trace, and the limits of the
/// groups of N > 1 (`wide`): the server, the run directory and the
/// database's URL.
async fn start_server(plan: &Plan, wide: &BTreeMap<u32, u32>) -> (PrivatePg, PathBuf, String) {
    println!(
        "faults: {} mode, seed {} (FAULTS_SEED={} replays it)",
        if plan.soak { "soak" } else { "CI" },
        plan.seed,
        plan.seed
    );
    let pg = PrivatePg::start().expect("start a private PostgreSQL");
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
        conn.batch_execute(FAULT_TRACE)
            .await
            .expect("create the trace tables and triggers");
        conn.batch_execute(FAULT_LONG)
            .await
            .expect("create the long-mode log trigger");
        conn.batch_execute(FAULT_HOT)
            .await
            .expect("create the hot jobs' log trigger");
        set_limits(&mut conn, wide).await;
    }
    (pg, run_dir, url)
}

/// The suite's state, with the workers and the freezer started.
async fn start_fleet(
    plan: &Plan,
    wide: BTreeMap<u32, u32>,
    run_dir: &std::path::Path,
    url: &str,
) -> Suite {
    let mut suite = Suite {
        rng: Rng::new(plan.seed),
        monitor: Monitor::new(url),
        fleet: Fleet::new(run_dir.to_path_buf(), url.to_owned()),
        url: url.to_owned(),
        jobs: Vec::new(),
        next_seq: vec![0; plan.groups as usize],
        specials: plan.specials(),
        special_groups: HashSet::new(),
        wide,
        retrying_in_wide: 0,
        waves: 0,
        hot_seq: vec![0; HOT_GROUPS as usize],
        hot_specials: vec![Mode::PanicOnce; plan.hot_panics],
        seen: Observed::default(),
        plan: plan.clone(),
    };
    for _ in 0..plan.workers {
        suite.fleet.spawn(Role::Worker, plan.concurrency).await;
    }
    suite.fleet.spawn(Role::Freezer, 1).await;
    suite.fleet.spawn(Role::Hot, HOT_GROUPS as usize).await;
    suite
}

/// The fault schedule: kills first (the poison job goes off meanwhile), the
/// rest spread at random.
fn schedule(plan: &Plan, rng: &mut Rng) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    steps.extend(std::iter::repeat_n(Step::Kill, plan.kills));
    steps.extend(std::iter::repeat_n(Step::HotKill, plan.hot_kills));
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
    rng.shuffle(&mut steps[..]);
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
    steps
}

/// Enqueues the first wave, then takes the fault steps with pauses and
/// top-ups between them; returns how long that took.
async fn inject_faults(
    suite: &mut Suite,
    pg: &mut PrivatePg,
    plan: &Plan,
    steps: &[Step],
    began: Instant,
) -> Duration {
    let first_wave = suite.wave(plan.wave);
    suite.enqueue(first_wave).await;
    let chaos = Instant::now();
    let mut freezes = 0;
    let mut prefetch_cuts = 0;
    for (i, step) in steps.iter().enumerate() {
        // A kill of the hot worker needs no pause: it waits for a burst.
        if *step != Step::HotKill {
            let pause = suite.rng.range(plan.step_ms.0, plan.step_ms.1);
            suite.pause(Duration::from_millis(pause)).await;
            suite.top_up().await;
        }
        match *step {
            Step::Kill => suite.kill_one().await,
            Step::HotKill => suite.kill_hot().await,
            Step::Terminate => suite.terminate_all().await,
            Step::Restart(mode) => suite.restart(pg, mode).await,
            Step::Freeze => {
                suite.freeze(freezes).await;
                if freezes == 0 {
                    suite.freeze_long(0).await;
                }
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
    chaos.elapsed()
}

/// Drain: the remaining jobs, then everything to a final state; then stops
/// the surviving processes. Whether all drained, and how long it took.
async fn drain(suite: &mut Suite, plan: &Plan) -> (bool, Duration) {
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
    (drained, drain)
}

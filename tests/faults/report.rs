//! The suite's report: the problems found, the summary line, and the list of
//! what fails the run.

use std::io::Write;
use std::time::{Duration, Instant};

use crate::checks::Found;
use crate::long_runs;
use crate::plan::Plan;
use crate::start_checks::JITTER;
use crate::suite::Suite;
use crate::wide::WideFound;

/// When the run began, how long its phases took, and whether it drained.
pub(crate) struct Timing {
    pub(crate) began: Instant,
    pub(crate) chaos: Duration,
    pub(crate) drain: Duration,
    pub(crate) drained: bool,
}

/// Prints the report and the summary line; returns the problems that fail
/// the run.
pub(crate) fn report(suite: &Suite, plan: &Plan, found: Found, timing: Timing) -> Vec<String> {
    let Found {
        lost,
        duplicates,
        wrong_outcome,
        failed_as_expected,
        order_violations,
        overlaps,
        torn,
        runs,
        interrupted,
        mid_handler_kills,
        hang_timeouts,
        panics,
        poison_aborts,
        unexpected,
        groups_used,
        frozen_release,
        wide,
        long,
        hot,
    } = found;
    let Timing {
        began,
        chaos,
        drain,
        drained,
    } = timing;
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
    show("ORDER VIOLATION", &wide.order_violations);
    show("ORDER VIOLATION", &hot.order_violations);
    show("HELD BACK VIOLATION", &wide.held_back);
    show("OVERLAP", &overlaps);
    show("EXCUSED (pick lost to a fault)", &wide.excused);
    show("UNEXPECTED EXIT", &unexpected);
    show("RECONNECT FAILURE", &suite.seen.reconnect_failures);
    show("FAILED CHECK", &suite.seen.failures);
    println!(
        "faults: {} processes started, {} handler runs recorded ({interrupted} cut off by a kill or \
         abort), {} pgfifo connections terminated, chaos {chaos:.1?}, drain {drain:.1?}",
        suite.fleet.records.len(),
        runs,
        suite.seen.terminated_backends
    );
    let wide_peak = print_wide(&wide);
    println!(
        "faults: hot groups: {} jobs, {} committed as followers, in {} transactions of more than \
         one job of a group (at most {}); {} runs ended well in a batch that never committed, {} \
         cut off by a kill",
        hot.jobs, hot.followers, hot.batches, hot.longest, hot.rolled_back, hot.killed
    );
    let order_violations_n =
        order_violations.len() + wide.order_violations.len() + hot.order_violations.len();
    let summary = format!(
        "jobs={} groups={groups_used} kills={} mid_handler_kills={mid_handler_kills} restarts={} \
         terminations={} frozen={} frozen_release={:.2}s poison_aborts={poison_aborts} \
         hang_timeouts={hang_timeouts} panics={panics} failed_as_expected={failed_as_expected} \
         lost={} duplicates={duplicates} order_violations={order_violations_n} overlaps={} \
         wide_groups={} wide_peak={} wide_at_n={} wide_holds={} holdback_violations={} \
         hot_jobs={} followers={} hot_kills={} hot_rolled_back={} wrong_outcomes={} unexpected_exits={} reconnect_failures={} failed_checks={} \
         torn_records={torn} duration={:.0}s",
        suite.jobs.len(),
        suite.seen.kills.len(),
        suite.seen.restarts,
        suite.seen.terminations,
        suite.seen.freezes.len(),
        frozen_release.as_secs_f64(),
        lost.len(),
        overlaps.len(),
        wide.peaks.len(),
        wide_peak.max,
        wide_peak.at_n,
        wide.wide_holds,
        wide.held_back.len(),
        hot.jobs,
        hot.followers,
        suite.seen.hot_kills.len(),
        hot.rolled_back,
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
        order_violations_n == 0,
        format!("order_violations={order_violations_n}"),
    );
    need(overlaps.is_empty(), format!("overlaps={}", overlaps.len()));
    need(
        wide.held_back.is_empty(),
        format!("holdback_violations={}", wide.held_back.len()),
    );
    need(
        wide.peaks.is_empty() || wide_peak.committed > 1,
        format!(
            "the groups of N > 1 never ran two jobs at once (wide_peak={}, committed {})",
            wide_peak.max, wide_peak.committed
        ),
    );
    need(
        hot.followers > 0,
        "no job ever ran as a follower (followers=0)".to_owned(),
    );
    need(
        suite.seen.hot_kills.len() >= plan.hot_kills,
        format!(
            "only {} kills of the hot worker",
            suite.seen.hot_kills.len()
        ),
    );
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
    println!(
        "faults: {} long_frozen_takeover={}",
        long_runs::summary(&long),
        suite
            .seen
            .long_freeze
            .map_or_else(|| "none".to_owned(), |d| format!("{:.2}s", d.as_secs_f64()))
    );
    need(
        plan.freezes == 0 || suite.seen.long_freeze.is_some(),
        "no frozen long-mode worker".to_owned(),
    );
    show("LONG JOB NEVER RAN AGAIN AFTER A KILL", &long.never_rerun);
    need(long.jobs > 0, "no long-mode job".to_owned());
    need(
        long.killed >= 1,
        "no kill hit a long-mode handler".to_owned(),
    );
    need(
        long.never_rerun.is_empty(),
        format!("long_never_rerun={}", long.never_rerun.len()),
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
    problems
}

/// The peaks of the groups of N > 1, over all of them.
struct WidePeaks {
    /// The most runs of one group at once, by the records.
    max: usize,
    /// The same by the committed runs.
    committed: usize,
    /// Groups whose runs reached their N at once.
    at_n: usize,
}

/// Prints the groups of N > 1: each one's N and peak (by the records and by
/// the committed runs), and what their start checks compared.
fn print_wide(wide: &WideFound) -> WidePeaks {
    let each: Vec<String> = wide
        .peaks
        .iter()
        .map(|p| format!("g{:04}:{}/{}({})", p.grp, p.recorded, p.n, p.committed))
        .collect();
    println!(
        "faults: groups of N > 1, group:peak runs at once by the records/N(by the committed runs): {}",
        each.join(" ")
    );
    println!(
        "faults: groups of N > 1: first starts of {} jobs compared with the jobs ahead of them, \
         the longest lead within the {} ms allowance {} (negative: picked after every job ahead \
         could have been, by at least that), {} early starts excused by a fault; {} jobs held \
         back their group after a failed attempt; {} recorded attempt starts forgotten (handed \
         back unstarted) or lost",
        wide.compared,
        JITTER.as_millis(),
        wide.max_lead_within_ms
            .map_or("-".to_owned(), |ms| format!("{ms:.1} ms")),
        wide.excused.len(),
        wide.wide_holds,
        wide.forgotten
    );
    let d = &wide.record_delays;
    if !d.is_empty() {
        println!(
            "faults: a committed run's pick -> its attempt recorded: median {:.1} ms, p99 {:.1} ms, \
             max {:.1} ms ({} runs)",
            d[d.len() / 2],
            d[d.len() * 99 / 100],
            d[d.len() - 1],
            d.len()
        );
    }
    WidePeaks {
        max: wide.peaks.iter().map(|p| p.recorded).max().unwrap_or(0),
        committed: wide.peaks.iter().map(|p| p.committed).max().unwrap_or(0),
        at_n: wide
            .peaks
            .iter()
            .filter(|p| p.recorded >= p.n as usize)
            .count(),
    }
}

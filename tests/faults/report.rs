//! The suite's report: the problems found, the summary line, and the list of
//! what fails the run.

use std::io::Write;
use std::time::{Duration, Instant};

use crate::checks::Found;
use crate::plan::Plan;
use crate::suite::Suite;

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
    show("OVERLAP", &overlaps);
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
    problems
}

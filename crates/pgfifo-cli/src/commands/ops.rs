//! Commands that change jobs and groups: retry, cancel, skip-head, purge,
//! pause and resume, and setting the failure policy.

use std::time::Duration;

use pgfifo::admin::{self, FailurePolicy, FinishedState, Retried, RetryResult};
use pgfifo::diesel_async::AsyncPgConnection;
use pgfifo::JobId;
use serde::Serialize;

use crate::duration::format_age;
use crate::error::{CliError, CliResult};
use crate::output::{name_of, plural, Output, Table};

/// `pgfifo retry ID...`: retries the given jobs.
pub async fn retry_ids(conn: &mut AsyncPgConnection, out: Output, ids: &[JobId]) -> CliResult {
    let report = admin::retry_jobs(conn, ids).await?;
    report_retries(out, &report, "no job to retry")
}

/// `pgfifo retry --queue Q [--group G] --failed`: retries every failed job
/// there, in order.
pub async fn retry_failed(
    conn: &mut AsyncPgConnection,
    out: Output,
    queue: &str,
    group: Option<&str>,
) -> CliResult {
    let report = admin::retry_failed(conn, queue, group).await?;
    let place = match group {
        Some(group) => format!("group {group} of queue {queue}"),
        None => format!("queue {queue}"),
    };
    report_retries(out, &report, &format!("no failed jobs in {place}"))
}

/// Prints a retry report (`empty` when it has no line) and fails when jobs
/// were named or found and none was retried.
fn report_retries(out: Output, report: &[Retried], empty: &str) -> CliResult {
    out.emit(&report, |report| {
        if report.is_empty() {
            return empty.to_owned();
        }
        let mut table = Table::new(&["ID", "RESULT", "MEANING"]);
        for r in report.iter() {
            table.row(vec![
                r.id.to_string(),
                name_of(&r.result),
                meaning(r.result).into(),
            ]);
        }
        let retried = retried_count(report);
        format!("{}\nretried {retried} of {}", table.render(), report.len())
    })?;
    match report {
        [] => Ok(()),
        [only] if only.result != RetryResult::Retried => Err(CliError::failure(format!(
            "job {} was not retried: {}",
            only.id,
            meaning(only.result)
        ))),
        _ if retried_count(report) == 0 => Err(CliError::failure(format!(
            "none of the {} jobs was retried",
            report.len()
        ))),
        _ => Ok(()),
    }
}

/// How many lines of a retry report are `retried`.
fn retried_count(report: &[Retried]) -> usize {
    report
        .iter()
        .filter(|r| r.result == RetryResult::Retried)
        .count()
}

/// What a retry result means, for people.
fn meaning(result: RetryResult) -> &'static str {
    match result {
        RetryResult::Retried => "queued again; runs next in its group",
        RetryResult::NotFailed => "not failed: left alone",
        RetryResult::UniqueKeyTaken => "a queued job holds its unique key: left failed",
        RetryResult::Missing => "no job with this id",
    }
}

/// What `cancel` did.
#[derive(Debug, Serialize)]
struct Cancelled {
    cancelled: JobId,
}

/// `pgfifo cancel ID`: cancels a job that has not finished.
pub async fn cancel(
    conn: &mut AsyncPgConnection,
    out: Output,
    id: JobId,
    reason: Option<&str>,
) -> CliResult {
    admin::cancel_job(conn, id, reason).await?;
    out.emit(&Cancelled { cancelled: id }, |c| {
        format!("cancelled job {}", c.cancelled)
    })
}

/// What `skip-head` did.
#[derive(Debug, Serialize)]
struct Skipped<'a> {
    queue: &'a str,
    group: &'a str,
    /// The skipped job; `None` when the group had no head.
    skipped: Option<JobId>,
}

/// `pgfifo skip-head --queue Q --group G`: fails the group's head and lets
/// the group go on.
pub async fn skip_head(
    conn: &mut AsyncPgConnection,
    out: Output,
    queue: &str,
    group: &str,
    reason: Option<&str>,
) -> CliResult {
    let skipped = admin::skip_head(conn, queue, group, reason).await?;
    let report = Skipped {
        queue,
        group,
        skipped,
    };
    out.emit(&report, |s| match s.skipped {
        Some(id) => format!(
            "skipped job {id} (now failed); group {} of queue {} goes on",
            s.group, s.queue
        ),
        None => "group has no head (idle, or paused): nothing skipped".to_owned(),
    })
}

/// What `purge` did.
#[derive(Debug, Serialize)]
struct Purged {
    deleted: u64,
    states: Vec<FinishedState>,
    older_than_secs: u64,
}

/// `pgfifo purge --older-than AGE`: deletes old finished jobs in `states`.
pub async fn purge(
    conn: &mut AsyncPgConnection,
    out: Output,
    older_than: Duration,
    states: &[FinishedState],
) -> CliResult {
    let deleted = admin::purge(conn, older_than, states).await?;
    let report = Purged {
        deleted,
        states: states.to_vec(),
        older_than_secs: older_than.as_secs(),
    };
    out.emit(&report, |p| {
        let states: Vec<&str> = p.states.iter().map(|s| s.as_str()).collect();
        format!(
            "deleted {} job{} ({}) that finished more than {} ago",
            p.deleted,
            plural(p.deleted),
            states.join(", "),
            format_age(older_than)
        )
    })
}

/// What `pause` and `resume` did.
#[derive(Debug, Serialize)]
struct PauseChange<'a> {
    queue: &'a str,
    group: Option<&'a str>,
    /// Whether it is paused now.
    paused: bool,
    /// `false` when it already was as asked.
    changed: bool,
}

/// `pgfifo pause|resume --queue Q [--group G]`: `pause` true pauses,
/// false resumes.
pub async fn pause(
    conn: &mut AsyncPgConnection,
    out: Output,
    queue: &str,
    group: Option<&str>,
    pause: bool,
) -> CliResult {
    let changed = match (group, pause) {
        (Some(group), true) => admin::pause_group(conn, queue, group).await?,
        (Some(group), false) => admin::resume_group(conn, queue, group).await?,
        (None, true) => admin::pause_queue(conn, queue).await?,
        (None, false) => admin::resume_queue(conn, queue).await?,
    };
    let report = PauseChange {
        queue,
        group,
        paused: pause,
        changed,
    };
    out.emit(&report, |p| {
        let what = match p.group {
            Some(group) => format!("group {group} of queue {}", p.queue),
            None => format!("queue {}", p.queue),
        };
        match (p.changed, p.paused) {
            (true, true) => format!("paused {what}"),
            (true, false) => format!("resumed {what}"),
            (false, true) => format!("{what} was already paused"),
            (false, false) => format!("{what} was not paused"),
        }
    })
}

/// What `policy` set.
#[derive(Debug, Serialize)]
struct PolicySet<'a> {
    queue: &'a str,
    failure_policy: FailurePolicy,
    /// Held groups released by switching to `continue`.
    released_groups: u64,
}

/// `pgfifo policy --queue Q continue|hold`: sets the failure policy.
pub async fn set_policy(
    conn: &mut AsyncPgConnection,
    out: Output,
    queue: &str,
    policy: FailurePolicy,
) -> CliResult {
    let released_groups = admin::set_failure_policy(conn, queue, policy).await?;
    let report = PolicySet {
        queue,
        failure_policy: policy,
        released_groups,
    };
    out.emit(&report, |p| {
        format!(
            "queue {}: failure policy is now {}; released {} held group{}",
            p.queue,
            p.failure_policy.as_str(),
            p.released_groups,
            plural(p.released_groups)
        )
    })
}

//! `pgfifo status` and `pgfifo policy --queue Q` (showing the policy).

use pgfifo::admin::{self, Count, FailurePolicy, QueueStatus};
use pgfifo::diesel_async::AsyncPgConnection;
use serde::Serialize;

use crate::error::CliResult;
use crate::output::{or_dash, yes_no, Output, Table};

/// `pgfifo status`: every known queue (or `queues`), with its `top`
/// largest group backlogs.
pub async fn status(
    conn: &mut AsyncPgConnection,
    out: Output,
    queues: &[String],
    top: usize,
) -> CliResult {
    let only = (!queues.is_empty()).then_some(queues);
    let statuses = admin::status(conn, only, top).await?;
    out.emit(&statuses, |s| render(s))
}

/// The status report for people: a table of queues, one of the largest
/// backlogs, and what `~` means.
fn render(statuses: &[QueueStatus]) -> String {
    if statuses.is_empty() {
        return "no queues known yet: a queue appears once a runner has seen its jobs, or \
                when it has a setting or failed jobs (name one with --queue to see it now)"
            .to_owned();
    }
    let mut queues = Table::new(&[
        "QUEUE",
        "QUEUED",
        "RUNNING",
        "RETRYING",
        "FAILED",
        "SUCCEEDED",
        "CANCELLED",
        "OLDEST",
        "BLOCKED (PAUSED/HELD/RETRYING/SNOOZED)",
        "PAUSED",
        "POLICY",
        "RUNNERS",
        "LIMITS",
    ]);
    let mut backlogs = Table::new(&["QUEUE", "GROUP", "BACKLOG"]);
    let mut estimated = false;
    let mut unknown = false;
    let mut backlogs_capped = false;
    for s in statuses {
        let counted = [s.queued, s.retrying, s.failed];
        let estimates = [s.succeeded, s.cancelled];
        estimated |= counted
            .iter()
            .chain(estimates.iter().flatten())
            .any(|c| !c.exact);
        unknown |= estimates.iter().any(Option::is_none);
        let estimate = |c: Option<Count>| c.map_or_else(|| "?".to_owned(), |c| c.to_string());
        let b = &s.blocked_groups;
        queues.row(vec![
            s.queue.clone(),
            s.queued.to_string(),
            s.running.to_string(),
            s.retrying.to_string(),
            s.failed.to_string(),
            estimate(s.succeeded),
            estimate(s.cancelled),
            or_dash(s.oldest_queued_age.map(admin::human)),
            format!(
                "{} ({}/{}/{}/{})",
                b.total(),
                b.paused,
                b.held,
                b.retrying,
                b.snoozed
            ),
            yes_no(s.paused),
            s.failure_policy.as_str().to_owned(),
            s.runners.to_string(),
            or_dash(s.limits),
        ]);
        backlogs_capped |= !s.largest_backlogs_exact;
        for g in &s.largest_backlogs {
            backlogs.row(vec![
                s.queue.clone(),
                g.group.clone(),
                g.backlog.to_string(),
            ]);
        }
    }
    let mut text = queues.render();
    if !backlogs.is_empty() {
        text.push_str("\nlargest backlogs");
        if backlogs_capped {
            text.push_str(&format!(
                " (among the first {} queued jobs of a queue)",
                admin::COUNT_CAP
            ));
        }
        text.push_str(":\n");
        text.push_str(&backlogs.render());
    }
    if estimated || unknown {
        text.push('\n');
    }
    if estimated {
        text.push_str(
            "~ marks an estimate (from table statistics, or a count past the counting cap)\n",
        );
    }
    if unknown {
        text.push_str(
            "? not estimated yet: the job table was never analyzed (autovacuum will; \
             or run ANALYZE pgfifo.job)\n",
        );
    }
    text
}

/// A queue's failure policy, as `pgfifo policy` prints it.
#[derive(Debug, Serialize)]
struct Policy<'a> {
    queue: &'a str,
    failure_policy: FailurePolicy,
}

/// `pgfifo policy --queue Q`: prints the queue's current failure policy.
pub async fn show_policy(conn: &mut AsyncPgConnection, out: Output, queue: &str) -> CliResult {
    let status = admin::queue_status(conn, queue, 0).await?;
    let policy = Policy {
        queue,
        failure_policy: status.failure_policy,
    };
    out.emit(&policy, |p| {
        format!(
            "queue {}: failure policy {}",
            p.queue,
            p.failure_policy.as_str()
        )
    })
}

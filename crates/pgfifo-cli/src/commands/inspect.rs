//! `pgfifo groups`, `pgfifo jobs` and `pgfifo job ID`: read-only views.

use pgfifo::admin::{
    self, GroupInfo, GroupQuery, GroupState, JobDetail, JobQuery, QueueUsage, QueueWait,
};
use pgfifo::diesel_async::AsyncPgConnection;
use pgfifo::JobId;

use crate::error::{CliError, CliResult};
use crate::output::{ago, fields, name_of, one_line, or_dash, time, yes_no, Output, Table};

/// How many characters of an error a table cell shows.
const ERROR_WIDTH: usize = 80;

/// `pgfifo groups --queue Q`: the queue's groups in name order.
pub async fn groups(
    conn: &mut AsyncPgConnection,
    out: Output,
    queue: &str,
    query: &GroupQuery,
) -> CliResult {
    let groups = admin::groups(conn, queue, query).await?;
    let usage = admin::queue_usage(conn, queue).await?;
    let full = query.limit.is_some_and(|l| groups.len() as i64 >= l);
    out.emit(&groups, |groups| {
        let header = usage.map_or_else(String::new, |u| queue_line(queue, &u));
        if groups.is_empty() {
            let which = if query.blocked_only { "blocked " } else { "" };
            return format!("{header}no {which}groups in queue {queue}");
        }
        let mut table = Table::new(&[
            "GROUP", "STATE", "BACKLOG", "RUNNING", "HEAD", "HEAD AGE", "LIMIT", "TOKENS", "DETAIL",
        ]);
        for g in groups {
            table.row(vec![
                g.group.clone(),
                name_of(&g.state),
                g.backlog.to_string(),
                format!("{}/{}", g.running, g.concurrency),
                or_dash(g.head),
                or_dash(g.head_age.map(admin::human)),
                limit_of(g),
                or_dash(g.tokens.map(|t| format!("{:.1}", t.max(0.0)))),
                group_detail(g),
            ]);
        }
        let mut text = header + &table.render();
        if full {
            let last = groups.last().map_or("", |g| g.group.as_str());
            text.push_str(&format!("\nmore may follow: --after {last:?}\n"));
        }
        text
    })
}

/// The queue's limits and what they hold back now, above its groups:
/// `queue payments: 20 at once (20 running, at its limit), 100/m, burst 10
/// (0.4 tokens, next at <time>)`.
fn queue_line(queue: &str, usage: &QueueUsage) -> String {
    let mut parts = Vec::new();
    if let Some(n) = usage.limits.concurrency {
        let running = usage.running.unwrap_or(0);
        let full = if usage.at_limit { ", at its limit" } else { "" };
        parts.push(format!("{n} at once ({running} running{full})"));
    }
    if let Some(rate) = usage.limits.rate {
        let burst = usage.limits.burst.unwrap_or(rate.count());
        let tokens = usage.tokens.unwrap_or(0.0).max(0.0);
        let next = usage
            .next_token_at
            .map_or_else(String::new, |at| format!(", next at {}", time(at)));
        parts.push(format!("{rate}, burst {burst} ({tokens:.1} tokens{next})"));
    }
    format!("queue {queue}: {}\n\n", parts.join(", "))
}

/// A group's rate limit and weight: `10/s burst 20, weight 3`, the weight
/// only when it is not 1, with `(own)` when the group has settings of its
/// own rather than only its queue's defaults.
fn limit_of(g: &GroupInfo) -> String {
    let mut parts = Vec::new();
    if let Some(rate) = g.rate {
        parts.push(format!("{rate} burst {}", g.burst.unwrap_or(rate.count())));
    }
    if g.weight != 1 {
        parts.push(format!("weight {}", g.weight));
    }
    let mut text = if parts.is_empty() {
        "-".to_owned()
    } else {
        parts.join(", ")
    };
    if g.own_limits {
        text.push_str(" (own)");
    }
    text
}

/// Why a group is blocked or waiting, in a few words.
fn group_detail(g: &GroupInfo) -> String {
    let error = || {
        one_line(
            g.head_error.as_deref().unwrap_or("no error recorded"),
            ERROR_WIDTH,
        )
    };
    match g.state {
        GroupState::Retrying => {
            format!(
                "retrying until {}: {}",
                or_dash(g.waiting_until.map(time)),
                error()
            )
        }
        GroupState::Held => format!("held: head {} failed: {}", or_dash(g.head), error()),
        GroupState::Paused => format!("paused since {}", or_dash(g.paused_at.map(time))),
        GroupState::Scheduled => {
            format!("scheduled for {}", or_dash(g.waiting_until.map(time)))
        }
        GroupState::Waiting => match &g.dependency_wait {
            Some(wait) => format!("head {}: {wait}", or_dash(g.head)),
            None => format!("head {} waits for its dependencies", or_dash(g.head)),
        },
        GroupState::Snoozed => format!(
            "snoozed until {}, by job {}",
            or_dash(g.snoozed_until.map(time)),
            or_dash(g.head)
        ),
        GroupState::RateLimited => {
            format!("next token at {}", or_dash(g.waiting_until.map(time)))
        }
        GroupState::Ready => g.queue_wait.map_or_else(String::new, queue_wait),
        GroupState::Idle | GroupState::Running => String::new(),
    }
}

/// Why a ready head waits for its queue: `waiting: the queue is at its
/// limit of 20 running`, or its rate's reason with the next token's time.
fn queue_wait(wait: QueueWait) -> String {
    match wait {
        QueueWait::Rate {
            next_token_at: Some(at),
            ..
        } => format!("{wait}; next at {}", time(at)),
        _ => wait.to_string(),
    }
}

/// `pgfifo jobs`: a page of jobs.
pub async fn jobs(conn: &mut AsyncPgConnection, out: Output, query: &JobQuery) -> CliResult {
    let jobs = admin::jobs(conn, query).await?;
    let full = query.limit.is_some_and(|l| jobs.len() as i64 >= l);
    out.emit(&jobs, |jobs| {
        if jobs.is_empty() {
            return "no jobs".to_owned();
        }
        let mut table = Table::new(&[
            "ID",
            "QUEUE",
            "GROUP",
            "KIND",
            "STATUS",
            "ATTEMPTS",
            "AGE",
            "LAST ERROR",
        ]);
        for j in jobs {
            table.row(vec![
                j.id.to_string(),
                j.queue.clone(),
                or_dash(j.group.as_deref()),
                j.kind.clone(),
                name_of(&j.status),
                format!("{}/{}", j.attempts, j.max_attempts),
                ago(j.created_at),
                j.last_error
                    .as_deref()
                    .map_or_else(String::new, |e| one_line(e, ERROR_WIDTH)),
            ]);
        }
        let mut text = table.render();
        if full {
            let last = jobs.last().map_or(0, |j| j.id);
            text.push_str(&format!("\nmore may follow: --after {last}\n"));
        }
        text
    })
}

/// `pgfifo job ID`: everything about one job; exit 1 when there is none.
pub async fn job(conn: &mut AsyncPgConnection, out: Output, id: JobId) -> CliResult {
    let job = admin::job(conn, id)
        .await?
        .ok_or_else(|| CliError::failure(pgfifo::Error::JobNotFound(id).to_string()))?;
    out.emit(&job, render_job)
}

/// The job's de-duplication window: `throttle "sync-42" every 10m, until
/// <time>`, and whether its key still leads to the job.
fn window(job: &JobDetail) -> String {
    let Some(w) = &job.window else {
        return "-".into();
    };
    let period = std::time::Duration::from_micros(w.period_us.unsigned_abs());
    let period = if period.subsec_nanos() == 0 {
        crate::duration::format_age(period)
    } else {
        format!("{period:?}")
    };
    let state = if w.holds { "holds its key" } else { "ended" };
    format!(
        "{} {:?} for {period}, until {} ({state})",
        w.mode,
        w.key,
        time(w.until)
    )
}

/// One job for people: its fields, payload, result and attempt log.
fn render_job(job: &JobDetail) -> String {
    let j = &job.summary;
    let mut text = fields(&[
        ("id", j.id.to_string()),
        ("queue", j.queue.clone()),
        ("group", or_dash(j.group.as_deref())),
        ("kind", j.kind.clone()),
        ("status", name_of(&j.status)),
        ("attempts", format!("{} of {}", j.attempts, j.max_attempts)),
        ("priority", job.priority.to_string()),
        ("unique key", or_dash(job.unique_key.as_deref())),
        ("group head", yes_no(job.is_head)),
        ("window", window(job)),
        (
            "waiting",
            or_dash(job.dependency_wait.as_ref().map(ToString::to_string)),
        ),
        (
            "created",
            format!("{} ({} ago)", time(j.created_at), ago(j.created_at)),
        ),
        ("run after", time(j.run_after)),
        ("finished", or_dash(j.finished_at.map(time))),
        ("last error", or_dash(j.last_error.as_deref())),
    ]);
    text.push_str("\npayload:\n");
    text.push_str(&indented_json(&job.payload));
    if let Some(result) = &job.result {
        text.push_str("\nresult:\n");
        text.push_str(&indented_json(result));
    }
    if job.attempt_log.is_empty() {
        text.push_str("\nattempts: none recorded\n");
    } else {
        let mut table = Table::new(&["ATTEMPT", "RUNNER", "STARTED", "FAILED AT", "ERROR"]);
        for a in &job.attempt_log {
            table.row(vec![
                a.attempt.to_string(),
                a.runner.clone(),
                time(a.started_at),
                or_dash(a.finished_at.map(time)),
                a.error
                    .as_deref()
                    .map_or_else(String::new, |e| one_line(e, ERROR_WIDTH)),
            ]);
        }
        text.push_str("\nattempts:\n");
        text.push_str(&table.render());
    }
    text
}

/// A JSON value pretty-printed, each line indented by two spaces.
fn indented_json(value: &serde_json::Value) -> String {
    let pretty = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    pretty.lines().map(|l| format!("  {l}\n")).collect()
}

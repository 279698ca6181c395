//! `pgfifo batches` and `pgfifo batch show ID`: batches' progress, and one
//! batch with its jobs and callbacks (docs/batches.md).

use clap::{Args, Subcommand};
use pgfifo::admin::{self, BatchProgress};
use pgfifo::diesel_async::AsyncPgConnection;
use pgfifo::BatchId;

use crate::error::{CliError, CliResult};
use crate::output::{fields, or_dash, time, Output, Table};

/// `pgfifo batches`'s options.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Show at most this many, newest first (1 to 1000).
    #[arg(long, default_value_t = 50)]
    limit: u32,
    /// Only batches with ids below this one (to page on).
    #[arg(long, value_name = "ID")]
    before: Option<BatchId>,
    /// Only batches that have not completed.
    #[arg(long)]
    unfinished: bool,
}

/// `pgfifo batch ...`.
#[derive(Debug, Subcommand)]
pub enum BatchAction {
    /// One batch: its counts, its jobs with their states, its callbacks
    Show {
        /// The batch's id.
        #[arg(value_parser = clap::value_parser!(BatchId).range(1..))]
        id: BatchId,
    },
}

/// `pgfifo batches`: the newest batches with their counts.
pub async fn list(conn: &mut AsyncPgConnection, out: Output, args: &ListArgs) -> CliResult {
    let batches = admin::batches(conn, args.before, args.limit, args.unfinished).await?;
    out.emit(&batches, |batches| {
        if batches.is_empty() {
            return "no batches".to_owned();
        }
        let mut table = Table::new(&[
            "ID",
            "STATE",
            "TOTAL",
            "SUCCEEDED",
            "FAILED",
            "CANCELLED",
            "PENDING",
            "CREATED",
            "DESCRIPTION",
        ]);
        for b in batches {
            table.row(vec![
                b.id.to_string(),
                b.state.as_str().to_owned(),
                b.total.to_string(),
                b.succeeded.to_string(),
                b.failed.to_string(),
                b.cancelled.to_string(),
                b.pending.to_string(),
                time(b.created_at),
                or_dash(b.description.as_deref()),
            ]);
        }
        table.render()
    })
}

/// `pgfifo batch show ID`: one batch in full. An unknown id is an
/// operational failure (exit 1).
pub async fn show(conn: &mut AsyncPgConnection, out: Output, id: BatchId) -> CliResult {
    let Some(summary) = admin::batch(conn, id).await? else {
        return Err(CliError::failure(format!("no batch has id {id}")));
    };
    out.emit(&summary, |s| {
        let mut text = progress_fields(&s.progress);
        if !s.callbacks.is_empty() {
            let mut table = Table::new(&["EVENT", "JOB TYPE", "QUEUE", "GROUP", "JOB"]);
            for c in &s.callbacks {
                table.row(vec![
                    c.event.clone(),
                    c.kind.clone(),
                    c.queue.clone(),
                    or_dash(c.group.as_deref()),
                    c.job_id
                        .map_or_else(|| "not fired".to_owned(), |j| j.to_string()),
                ]);
            }
            text.push_str("\ncallbacks:\n");
            text.push_str(&table.render());
        }
        let mut table = Table::new(&["JOB", "STATE"]);
        for j in &s.jobs {
            table.row(vec![
                j.id.to_string(),
                j.state.clone().unwrap_or_else(|| "purged".to_owned()),
            ]);
        }
        text.push_str("\njobs:\n");
        text.push_str(&table.render());
        text
    })
}

fn progress_fields(p: &BatchProgress) -> String {
    fields(&[
        ("batch", p.id.to_string()),
        ("description", or_dash(p.description.as_deref())),
        ("state", p.state.as_str().to_owned()),
        (
            "jobs",
            format!(
                "{} in all: {} succeeded, {} failed, {} cancelled, {} pending",
                p.total, p.succeeded, p.failed, p.cancelled, p.pending
            ),
        ),
        ("created", time(p.created_at)),
        ("closed", or_dash(p.closed_at.map(time))),
        ("completed", or_dash(p.completed_at.map(time))),
        ("first failure", or_dash(p.first_failed_at.map(time))),
    ])
}

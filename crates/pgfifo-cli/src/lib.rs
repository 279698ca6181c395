//! `pgfifo`: the operator's command-line tool for pgfifo. Applies and
//! reverts the schema migrations, shows queues, groups and jobs, and repairs
//! them (retry, cancel, skip a head, pause and resume, failure policy,
//! purge), sets the limits of groups, and lists and steers recurring jobs.
//! A thin layer over `pgfifo::admin` and `pgfifo::migrate`.
//!
//! The `pgfifo` binary is this library's [`main`]. An application's own
//! binary that calls it (`fn main() -> ExitCode { pgfifo_cli::main() }`)
//! has every command, and `job-types` lists the application's job types
//! there: see docs/enqueue-from-sql.md.

mod args;
mod commands;
mod duration;
mod error;
mod output;

use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgGroup, Args, Parser, Subcommand};
use pgfifo::admin::FinishedState;
use pgfifo::JobId;

use crate::args::{job_id, limit, PolicyArg, PurgeState, StateArg};
use crate::commands::migrate::MigrateAction;
use crate::error::{CliError, CliResult};
use crate::output::Output;

/// The exit codes, shown at the end of `pgfifo --help`.
const EXIT_CODES: &str = "\
Exit status:
  0  success
  1  operational failure: database unreachable, job not found, job running, ...
  2  usage error: bad arguments or options, no database URL

Errors go to stderr as text, also with --json.";

/// Sees and steers pgfifo's queues, groups and jobs in a PostgreSQL database.
#[derive(Debug, Parser)]
#[command(name = "pgfifo", version, after_help = EXIT_CODES)]
struct Cli {
    /// URL of the database with the pgfifo schema (postgres://user@host:port/db).
    #[arg(
        long,
        env = "DATABASE_URL",
        global = true,
        value_name = "URL",
        hide_env_values = true
    )]
    database_url: Option<String>,

    /// The URL leads to a pooler in transaction mode (PgBouncer
    /// `pool_mode = transaction`, a managed proxy): send every statement in
    /// a transaction and keep no prepared statements (see docs/deploying.md).
    #[arg(long, env = "PGFIFO_TRANSACTION_POOLER", global = true)]
    transaction_pooler: bool,

    /// Print one JSON document on stdout instead of text.
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the web dashboard (127.0.0.1:8080 by default)
    ///
    /// Queues, groups and why each one waits, jobs with their payloads and
    /// attempts, and the actions that unblock them (retry, cancel, skip the
    /// head, pause, resume), each confirmed and protected against
    /// cross-site requests.
    Dashboard(commands::dashboard::DashboardArgs),
    /// Apply, revert or list pgfifo's schema migrations
    Migrate {
        #[command(subcommand)]
        action: MigrateAction,
    },
    /// Each queue at a glance
    ///
    /// Per queue: jobs queued, running, retrying, failed, succeeded and
    /// cancelled (`~` marks an estimate), the age of the oldest queued job,
    /// blocked groups (paused, held, retrying), the paused flag, the failure
    /// policy, live runners, and the groups with the largest backlogs.
    Status(StatusArgs),
    /// The groups of a queue: backlog, head, limits, and why one is blocked
    ///
    /// Groups are listed in name order; page with --after and --limit.
    /// RUNNING is the group's jobs running now and how many may run at once
    /// (its concurrency). LIMIT is its rate limit and burst, its weight when
    /// not 1, and `(own)` when the group has settings of its own (`pgfifo
    /// group set`). TOKENS is what its token bucket holds now: each start
    /// takes one.
    Groups(GroupsArgs),
    /// List jobs, newest first
    ///
    /// Page with --after (the last id shown) and --limit.
    Jobs(JobsArgs),
    /// Everything stored about one job: fields, payload and attempt log
    ///
    /// Exits with 1 when no job has this id.
    Job {
        /// The job's id.
        #[arg(value_parser = job_id())]
        id: JobId,
    },
    /// Put failed jobs back in their queues, in their original order
    #[command(
        long_about = "Put failed jobs back in their queues, each with a fresh budget of \
                      attempts. A retried job runs next in its group, before every job \
                      enqueued after it; retrying the failed head of a held group releases it.\n\n\
                      Give job ids, or --failed with --queue (and optionally --group) to retry \
                      every failed job there.",
        after_help = "Exit status: 0 when at least one job was retried (the report gives each \
                      job's result: retried, not_failed, unique_key_taken or missing), and when \
                      --failed finds no failed job; 1 when jobs were named or found and none \
                      of them could be retried."
    )]
    Retry(RetryArgs),
    /// Cancel a job that has not finished
    ///
    /// The job may be waiting, scheduled or between retries. A running job
    /// cannot be cancelled (exit 1; nothing changes). A cancelled head is
    /// replaced by the next job of its group.
    Cancel {
        /// The job's id.
        #[arg(value_parser = job_id())]
        id: JobId,
        /// Recorded as the job's last error.
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
    },
    /// Mark a group's head failed and let the group go on
    ///
    /// A held group's failed head is skipped as it is. Prints the skipped
    /// job's id, or that the group has no head. A running head cannot be
    /// skipped (exit 1; nothing changes).
    SkipHead {
        /// The queue.
        #[arg(long, value_name = "Q")]
        queue: String,
        /// The group.
        #[arg(long, value_name = "G")]
        group: String,
        /// Recorded as the job's last error.
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
    },
    /// Delete old finished jobs
    ///
    /// Deletes jobs that finished more than --older-than ago, with their
    /// attempt records, in short batches. Queued and running jobs are never
    /// touched, nor a held group's failed head. Prints how many were deleted.
    Purge {
        /// Minimum time since the job finished: a whole number and a unit s, m,
        /// h, d or w (90s, 30m, 12h, 7d, 2w).
        #[arg(
            long,
            value_name = "AGE",
            value_parser = duration::parse_age,
            allow_hyphen_values = true
        )]
        older_than: Duration,
        /// Final states to delete (repeatable). Default: succeeded and
        /// cancelled; failed jobs only when named.
        #[arg(long = "state", value_name = "STATE", value_enum)]
        states: Vec<PurgeState>,
    },
    /// Pause a queue, or one group of it
    ///
    /// No job of it starts until it is resumed. Running jobs finish; new
    /// jobs are accepted and wait.
    Pause(Target),
    /// Resume a paused queue or group
    Resume(Target),
    /// Show or set what a permanently failed head does to its group
    #[command(
        long_about = "Show or set a queue's failure policy: what a job that failed for good \
                      does to its group. `continue` (the default): the job is kept as failed \
                      and the group goes on. `hold`: the group stops at the failed job until \
                      it is retried (`pgfifo retry`) or skipped (`pgfifo skip-head`). \
                      Switching to `continue` releases the groups held now."
    )]
    Policy {
        /// The queue.
        #[arg(long, value_name = "Q")]
        queue: String,
        /// The new policy; without it the current one is printed.
        #[arg(value_enum)]
        policy: Option<PolicyArg>,
    },
    /// Batches, newest first: state, counts per outcome, description
    Batches(commands::batches::ListArgs),
    /// Show one batch: its counts, jobs and callbacks
    Batch {
        #[command(subcommand)]
        action: commands::batches::BatchAction,
    },
    /// Recurring jobs: name, expression, zone, next and last tick, last job
    ///
    /// A schedule is `stale` when no live runner declares it as stored: it
    /// does not fire until one does.
    Schedules,
    /// Show, pause, resume or delete one recurring job
    Schedule {
        #[command(subcommand)]
        action: commands::schedules::ScheduleAction,
    },
    /// Set, reset and list the limits of groups: rate, burst, concurrency, weight
    #[command(long_about = commands::limits::ABOUT)]
    Group {
        #[command(subcommand)]
        action: commands::limits::GroupAction,
    },
    /// Set, reset and show the limits of a whole queue: concurrency, rate, burst
    #[command(long_about = commands::queue_limits::ABOUT)]
    Queue {
        #[command(subcommand)]
        action: commands::queue_limits::QueueAction,
    },
    /// The job types this binary knows: kind, queue, settings, payload schema
    #[command(long_about = commands::job_types::ABOUT)]
    JobTypes,
}

/// `pgfifo status`.
#[derive(Debug, Args)]
struct StatusArgs {
    /// Only this queue (repeatable). Default: every queue pgfifo knows of.
    #[arg(long = "queue", value_name = "Q")]
    queues: Vec<String>,
    /// How many of the largest group backlogs to show per queue.
    #[arg(long, value_name = "N", default_value_t = 5)]
    top: usize,
}

/// `pgfifo groups`.
#[derive(Debug, Args)]
struct GroupsArgs {
    /// The queue.
    #[arg(long, value_name = "Q")]
    queue: String,
    /// Only blocked groups (paused, held, retrying or snoozed).
    #[arg(long)]
    blocked: bool,
    /// Groups after this one in name order (for paging).
    #[arg(long, value_name = "G")]
    after: Option<String>,
    /// Only groups whose name starts with this.
    #[arg(long, value_name = "P")]
    prefix: Option<String>,
    /// At most this many groups.
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = limit())]
    limit: i64,
}

/// `pgfifo jobs`.
#[derive(Debug, Args)]
struct JobsArgs {
    /// Only this queue.
    #[arg(long, value_name = "Q")]
    queue: Option<String>,
    /// Only this group (needs --queue).
    #[arg(long, value_name = "G", requires = "queue")]
    group: Option<String>,
    /// Only jobs in this state (queued: any unfinished job, including
    /// scheduled, running and retrying ones).
    #[arg(long, value_name = "STATE", value_enum)]
    state: Option<StateArg>,
    /// Oldest first (default: newest first).
    #[arg(long)]
    oldest_first: bool,
    /// Continue after this id, in the listing's order (for paging).
    #[arg(long, value_name = "ID")]
    after: Option<JobId>,
    /// At most this many jobs.
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = limit())]
    limit: i64,
}

/// `pgfifo retry`: ids, or every failed job of a queue (or group).
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("which").required(true).args(["ids", "failed"])))]
struct RetryArgs {
    /// Ids of failed jobs to retry.
    #[arg(value_name = "ID", value_parser = job_id(), conflicts_with_all = ["queue", "group"])]
    ids: Vec<JobId>,
    /// Retry every failed job of --queue (of --group, if given).
    #[arg(long, requires = "queue")]
    failed: bool,
    /// The queue whose failed jobs to retry (with --failed).
    #[arg(long, value_name = "Q", requires = "failed")]
    queue: Option<String>,
    /// Only this group's failed jobs (with --failed).
    #[arg(long, value_name = "G", requires = "failed")]
    group: Option<String>,
}

/// The queue, or one group of it, that `pause` and `resume` act on.
#[derive(Debug, Args)]
struct Target {
    /// The queue.
    #[arg(long, value_name = "Q")]
    queue: String,
    /// Only this group of the queue.
    #[arg(long, value_name = "G")]
    group: Option<String>,
}

/// Runs the tool on this process's arguments: parses them, runs one
/// command, prints its result, and returns the exit code (see `pgfifo
/// --help`).
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => return fail(CliError::failure(format!("cannot start: {err}"))),
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => fail(err),
    }
}

/// Reports a failure on stderr and gives its exit code.
fn fail(err: CliError) -> ExitCode {
    eprintln!("error: {err}");
    err.exit_code()
}

/// Connects and runs one command.
async fn run(cli: Cli) -> CliResult {
    if let Command::JobTypes = cli.command {
        // Reads this binary's registrations: no database.
        return commands::job_types::list(Output { json: cli.json });
    }
    let url = cli
        .database_url
        .filter(|url| !url.trim().is_empty())
        .ok_or_else(|| {
            CliError::usage(
                "no database URL: pass --database-url URL or set DATABASE_URL \
                 (e.g. postgres://postgres@127.0.0.1:5432/app)",
            )
        })?;
    let out = Output { json: cli.json };
    let command = match cli.command {
        Command::Dashboard(args) => {
            return commands::dashboard::serve(&url, cli.transaction_pooler, args).await;
        }
        other => other,
    };
    let mut conn = commands::connect(&url, cli.transaction_pooler).await?;
    let conn = &mut *conn;
    use commands::{batches, inspect, limits, migrate, ops, queue_limits, schedules, status};
    match command {
        Command::Dashboard(_) => unreachable!("served above"),
        Command::JobTypes => unreachable!("listed above"),
        Command::Migrate { action } => match action {
            MigrateAction::Up => migrate::up(conn, out).await,
            MigrateAction::Down { n } => migrate::down(conn, out, n as usize).await,
            MigrateAction::Status => migrate::status(conn, out).await,
            MigrateAction::Distribute => migrate::distribute(conn, out).await,
        },
        Command::Status(args) => status::status(conn, out, &args.queues, args.top).await,
        Command::Groups(args) => {
            let query = pgfifo::admin::GroupQuery {
                blocked_only: args.blocked,
                after: args.after,
                prefix: args.prefix,
                limit: Some(args.limit),
                ..Default::default()
            };
            inspect::groups(conn, out, &args.queue, &query).await
        }
        Command::Jobs(args) => {
            let query = pgfifo::admin::JobQuery {
                queue: args.queue,
                group: args.group,
                state: args.state.map(Into::into),
                oldest_first: args.oldest_first,
                after: args.after,
                limit: Some(args.limit),
            };
            inspect::jobs(conn, out, &query).await
        }
        Command::Job { id } => inspect::job(conn, out, id).await,
        Command::Retry(args) => match args.queue {
            Some(queue) => ops::retry_failed(conn, out, &queue, args.group.as_deref()).await,
            None => ops::retry_ids(conn, out, &args.ids).await,
        },
        Command::Cancel { id, reason } => ops::cancel(conn, out, id, reason.as_deref()).await,
        Command::SkipHead {
            queue,
            group,
            reason,
        } => ops::skip_head(conn, out, &queue, &group, reason.as_deref()).await,
        Command::Purge { older_than, states } => {
            let states: Vec<FinishedState> = if states.is_empty() {
                vec![FinishedState::Succeeded, FinishedState::Cancelled]
            } else {
                FinishedState::ALL
                    .into_iter()
                    .filter(|s| states.iter().any(|&named| FinishedState::from(named) == *s))
                    .collect()
            };
            ops::purge(conn, out, older_than, &states).await
        }
        Command::Pause(target) => {
            ops::pause(conn, out, &target.queue, target.group.as_deref(), true).await
        }
        Command::Resume(target) => {
            ops::pause(conn, out, &target.queue, target.group.as_deref(), false).await
        }
        Command::Policy { queue, policy } => match policy {
            Some(policy) => ops::set_policy(conn, out, &queue, policy.into()).await,
            None => status::show_policy(conn, out, &queue).await,
        },
        Command::Batches(args) => batches::list(conn, out, &args).await,
        Command::Batch { action } => match action {
            batches::BatchAction::Show { id } => batches::show(conn, out, id).await,
        },
        Command::Schedules => schedules::list(conn, out).await,
        Command::Schedule { action } => match action {
            schedules::ScheduleAction::Show { name } => schedules::show(conn, out, &name).await,
            schedules::ScheduleAction::Pause { name } => {
                schedules::pause(conn, out, &name, true).await
            }
            schedules::ScheduleAction::Resume { name } => {
                schedules::pause(conn, out, &name, false).await
            }
            schedules::ScheduleAction::Delete { name } => schedules::delete(conn, out, &name).await,
        },
        Command::Group { action } => limits::run(conn, out, action).await,
        Command::Queue { action } => queue_limits::run(conn, out, action).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn retry_needs_exactly_one_form() {
        let parse = |args: &[&str]| Cli::try_parse_from([&["pgfifo", "retry"], args].concat());
        assert!(parse(&["1", "2"]).is_ok());
        assert!(parse(&["--queue", "q", "--failed"]).is_ok());
        assert!(parse(&["--queue", "q", "--group", "g", "--failed"]).is_ok());
        assert!(parse(&[]).is_err());
        assert!(parse(&["1", "--queue", "q", "--failed"]).is_err());
        assert!(parse(&["--failed"]).is_err());
        assert!(parse(&["--queue", "q"]).is_err());
        assert!(parse(&["0"]).is_err());
    }

    #[test]
    fn migrate_down_needs_a_positive_count() {
        let parse = |n: &str| Cli::try_parse_from(["pgfifo", "migrate", "down", n]);
        assert!(parse("1").is_ok());
        assert!(parse("0").is_err());
        assert!(parse("-1").is_err());
    }
}

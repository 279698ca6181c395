//! `pgfifo queue set|reset|limits`: a whole queue's limits, across all its
//! groups and runners (docs/queue-limits.md). The command line's types are
//! here too, so that `lib.rs` only routes.

use clap::{ArgGroup, Args, Subcommand};
use pgfifo::admin;
use pgfifo::diesel_async::AsyncPgConnection;
use pgfifo::{QueueLimits, Rate, MAX_QUEUE_CONCURRENCY, MAX_RATE_COUNT};
use serde::Serialize;

use super::limits::{parse_count, parse_rate, Setting};
use crate::error::CliResult;
use crate::output::{fields, Output};

/// `pgfifo queue --help`.
pub const ABOUT: &str = "\
Set, reset and show the limits of a whole queue: how many of its jobs run at
once across every runner, and a token bucket for its starts. They add to the
groups' own limits (`pgfifo group`): a job starts only when its group and its
queue allow it. A change applies from the next start; running jobs go on.";

/// `pgfifo queue ...`.
#[derive(Debug, Subcommand)]
pub enum QueueAction {
    /// Change some limits of a queue
    ///
    /// Changes the limits given and keeps the others. `none` clears a limit.
    /// Prints the limits after the change. A bad value is refused (exit 2)
    /// and changes nothing.
    #[command(
        override_usage = "pgfifo queue set <QUEUE> [--concurrency <N|none>] [--rate <RATE|none>] \
                                [--burst <N|none>]"
    )]
    Set(SetArgs),
    /// Remove every limit of a queue
    ///
    /// Says whether anything was set.
    Reset {
        /// The queue.
        queue: String,
    },
    /// Show the limits of a queue
    Limits {
        /// The queue.
        queue: String,
    },
}

/// `pgfifo queue set`.
#[derive(Debug, Args)]
#[command(group(
    ArgGroup::new("settings")
        .required(true)
        .multiple(true)
        .args(["concurrency", "rate", "burst"])
))]
pub struct SetArgs {
    /// The queue.
    queue: String,
    /// How many of the queue's jobs may run at once, across all runners,
    /// 1 to 10000. `none` clears it.
    #[arg(long, value_name = "N", value_parser = parse_concurrency, allow_hyphen_values = true)]
    concurrency: Option<Setting<u32>>,
    /// At most this many starts of the queue's jobs per period, on average,
    /// across all runners: COUNT/PERIOD (10/s, 600/5m, 1/250ms). `none`
    /// clears it.
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    rate: Option<Setting<Rate>>,
    /// How many starts may happen at once after a quiet spell, 1 to 1000000
    /// (default: the rate's count; needs a rate). `none` clears it.
    #[arg(long, value_name = "N", value_parser = parse_burst, allow_hyphen_values = true)]
    burst: Option<Setting<u32>>,
}

fn parse_concurrency(text: &str) -> Result<Setting<u32>, String> {
    parse_count("concurrency", text, MAX_QUEUE_CONCURRENCY)
}

fn parse_burst(text: &str) -> Result<Setting<u32>, String> {
    parse_count("burst", text, MAX_RATE_COUNT)
}

/// Runs one `pgfifo queue` command.
pub async fn run(conn: &mut AsyncPgConnection, out: Output, action: QueueAction) -> CliResult {
    match action {
        QueueAction::Set(args) => set(conn, out, args).await,
        QueueAction::Reset { queue } => {
            let had = admin::reset_queue_limits(conn, &queue).await?;
            out.emit(&serde_json::json!({ "queue": queue, "reset": had }), |_| {
                if had {
                    format!("queue {queue}: limits removed")
                } else {
                    format!("queue {queue} had no limits")
                }
            })
        }
        QueueAction::Limits { queue } => {
            let now = admin::queue_limits(conn, &queue).await?;
            show(out, &queue, now)
        }
    }
}

/// `pgfifo queue set`: changes the limits given and keeps the others, in
/// one statement.
async fn set(conn: &mut AsyncPgConnection, out: Output, args: SetArgs) -> CliResult {
    let mut change = Vec::new();
    let mut limits = QueueLimits::new();
    if let Some(setting) = args.concurrency {
        change.push("concurrency");
        limits.concurrency = value(setting);
    }
    if let Some(setting) = args.rate {
        change.push("rate");
        limits.rate = value(setting);
    }
    if let Some(setting) = args.burst {
        change.push("burst");
        limits.burst = value(setting);
    }
    let now = admin::change_queue_limits(conn, &args.queue, &change, limits).await?;
    show(out, &args.queue, now)
}

fn value<T>(setting: Setting<T>) -> Option<T> {
    match setting {
        Setting::Clear => None,
        Setting::To(value) => Some(value),
    }
}

/// A queue's limits, as `set` and `limits` print them.
#[derive(Debug, Serialize)]
struct Shown<'a> {
    queue: &'a str,
    concurrency: Option<u32>,
    /// `COUNT/PERIOD`, as `--rate` takes it.
    rate: Option<String>,
    burst: Option<u32>,
}

fn show(out: Output, queue: &str, limits: Option<QueueLimits>) -> CliResult {
    let limits = limits.unwrap_or_default();
    let shown = Shown {
        queue,
        concurrency: limits.concurrency,
        rate: limits.rate.map(|rate| rate.to_string()),
        burst: limits.burst,
    };
    out.emit(&shown, |s| {
        let or =
            |v: Option<String>, otherwise: &str| v.unwrap_or_else(|| format!("- ({otherwise})"));
        format!(
            "queue {}:\n{}",
            s.queue,
            fields(&[
                (
                    "concurrency",
                    or(s.concurrency.map(|n| n.to_string()), "no limit")
                ),
                ("rate", or(s.rate.clone(), "no limit")),
                (
                    "burst",
                    or(s.burst.map(|n| n.to_string()), "the rate's count")
                ),
            ])
        )
    })
}

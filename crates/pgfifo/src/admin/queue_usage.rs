//! What a queue's limits hold back now: its slots in use and its tokens
//! ([`queue_usage`]), and why a group whose head is ready waits for its
//! queue ([`QueueWait`], in [`GroupInfo::queue_wait`](super::GroupInfo::queue_wait)).
//! Read-only: nothing here takes a lock or changes a row.

use std::fmt;
use std::time::SystemTime;

use diesel_async::AsyncPgConnection;
use serde::Serialize;

use super::queue_limits::queue_limits_of_row;
use crate::db;
use crate::db::admin::queue_limits::QueueUsageRow;
use crate::db::pooler::pinned;
use crate::names::validate_queue;
use crate::time::{from_micros, ser_opt_time};
use crate::{QueueLimits, Rate, Result};

/// A queue's limits and what they hold back now (see [`queue_usage`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[non_exhaustive]
pub struct QueueUsage {
    /// The limits set (the burst as set: `None` is the rate's count).
    pub limits: QueueLimits,
    /// With a concurrency: how many of its slots are held now, each by a
    /// runner's lane that runs the queue's jobs (one after another) or by
    /// a long run. Read from the server's locks, so a slot held by a
    /// runner that died is counted until the server ends its session. Can
    /// exceed the concurrency for a while after it was lowered.
    pub running: Option<u32>,
    /// With a concurrency: no slot a pick may take is free, or (after the
    /// concurrency was lowered) a job still holds a slot above it. No job
    /// of the queue starts until that changes.
    pub at_limit: bool,
    /// With a rate: the tokens in its bucket now; a start takes one.
    pub tokens: Option<f64>,
    /// With a rate and an empty bucket: when its next token is due.
    #[serde(serialize_with = "ser_opt_time")]
    pub next_token_at: Option<SystemTime>,
}

impl QueueUsage {
    /// Why a group of the queue whose head is ready cannot start now
    /// because of the queue, `None` when the queue would let it start. A
    /// queue at its concurrency comes first: a token would not start a job
    /// without a slot.
    pub fn wait(&self) -> Option<QueueWait> {
        if let (Some(limit), true) = (self.limits.concurrency, self.at_limit) {
            return Some(QueueWait::Concurrency {
                limit,
                running: self.running.unwrap_or(limit),
            });
        }
        match (self.limits.rate, self.next_token_at) {
            (Some(rate), Some(at)) => Some(QueueWait::Rate {
                rate,
                burst: self.limits.burst.unwrap_or(rate.count()),
                next_token_at: Some(at),
            }),
            _ => None,
        }
    }
}

/// Why a group whose head is ready waits for its queue rather than for a
/// runner (see [`GroupInfo::queue_wait`](super::GroupInfo::queue_wait)).
/// Its [`Display`](fmt::Display) is the reason `pgfifo groups` and the
/// dashboard show.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum QueueWait {
    /// Every slot of the queue is held: `limit` of its jobs run (`running`
    /// slots are held, more than `limit` for a while after it was
    /// lowered).
    Concurrency {
        /// The queue's concurrency.
        limit: u32,
        /// Its slots held now.
        running: u32,
    },
    /// The queue's bucket is empty.
    Rate {
        /// The queue's rate.
        #[serde(serialize_with = "ser_rate")]
        rate: Rate,
        /// Its burst.
        burst: u32,
        /// When its next token is due.
        #[serde(serialize_with = "ser_opt_time")]
        next_token_at: Option<SystemTime>,
    },
}

impl fmt::Display for QueueWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueueWait::Concurrency { limit, .. } => {
                write!(f, "waiting: the queue is at its limit of {limit} running")
            }
            QueueWait::Rate { rate, burst, .. } => write!(
                f,
                "waiting: the queue's rate ({rate}, burst {burst}) has no token left"
            ),
        }
    }
}

/// The limits of `queue` and what they hold back now; `None` when it has
/// no limits. The slots are counted from the locks the server holds (a
/// slot's row lock goes with an advisory lock that `pg_locks` shows), the
/// tokens from the queue's bucket: real state, not what runners report.
///
/// ```no_run
/// # async fn run(conn: &mut pgfifo::diesel_async::AsyncPgConnection) -> pgfifo::Result<()> {
/// use pgfifo::admin;
///
/// if let Some(usage) = admin::queue_usage(conn, "payments").await? {
///     println!("{} ({:?} running)", usage.limits, usage.running);
///     if let Some(wait) = usage.wait() {
///         println!("ready groups are {wait}");
///     }
/// }
/// # Ok(())
/// # }
/// ```
pub async fn queue_usage(conn: &mut AsyncPgConnection, queue: &str) -> Result<Option<QueueUsage>> {
    validate_queue(queue)?;
    pinned(conn, async |conn| read(conn, queue).await).await
}

/// [`queue_usage`] on a connection already pinned (for the group listings).
pub(super) async fn read(conn: &mut AsyncPgConnection, queue: &str) -> Result<Option<QueueUsage>> {
    let row = db::admin::queue_limits::queue_usage(conn, queue).await?;
    Ok(row.map(usage_of_row))
}

fn usage_of_row(row: QueueUsageRow) -> QueueUsage {
    let limits = queue_limits_of_row(row.limits);
    // Every slot a pick may take is held, or (after the concurrency was
    // lowered) a slot above the limit still is: the pick starts nothing
    // then (see `pgfifo.pick`).
    let at_limit = match (limits.concurrency, row.slots_held_below_limit) {
        (Some(limit), Some(held)) => {
            (held >= 0 && held as u32 >= limit) || row.slots_held.is_some_and(|all| all > held)
        }
        _ => false,
    };
    // A token is due later than now only when the bucket is empty.
    let next_token_at = match (row.tokens, row.next_token_us) {
        (Some(tokens), Some(us)) if tokens < 1.0 - 1e-9 => Some(from_micros(us)),
        _ => None,
    };
    QueueUsage {
        limits,
        running: row.slots_held.map(|n| n.max(0) as u32),
        at_limit,
        tokens: row.tokens,
        next_token_at,
    }
}

/// A rate as `pgfifo` writes it (`100/m`).
fn ser_rate<S: serde::Serializer>(rate: &Rate, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.collect_str(rate)
}

//! The queue-token watch: keeps a rate-limited queue at its rate.
//!
//! A pick passes a queue whose bucket is empty by (`pgfifo.pick`), and a
//! lane whose pick finds nothing waits for a wake-up or its poll. Nothing
//! else announces the queue's next token: without this task, the lanes of
//! a queue at its rate look again only at their polls, and the tokens that
//! come while every lane sleeps spill over the bucket's burst and are lost
//! (measured over 60 s across three runners, with a burst of 10 and the
//! default poll of 1 s: 65 % of a 50/s rate, 35 % of 200/s;
//! `pgfifo-bench queue-rate`).
//!
//! So while a queue the runner serves has a rate and work ready, this task
//! looks at its bucket and notes on the runner's [`Timer`] when it will
//! hold half its burst (at least one token): the timer then wakes an idle
//! lane, whose picks take the tokens there are (a pick that took a job
//! picks again at once). It looks again after those tokens' time, so each
//! runner looks about `2 × rate / burst` times a second per queue at its
//! rate (one statement each; with a burst of 1, once per token). Several
//! runners each wake a lane: the first to pick takes the tokens, and the
//! others find nothing, which costs them one pick.
//!
//! While no queue it serves has a rate, the task looks once a poll
//! interval (a queue given a rate is found then). While a rate-limited
//! queue has no ready work, it also looks when the listener has handled a
//! notification (new work, a changed limit), at most once per
//! [`AFTER_NOTE`]: the enqueue's notification wakes lanes that take the
//! bucket's tokens, and the task keeps the queue going from there.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::maintenance::{pooled, Complaints};
use super::timer::Timer;
use crate::db::queue_rate::{rate_limited, QueueBucket};
use crate::db::Pool;

/// The shortest time between two looks, whatever the rate.
const MIN_LOOK: Duration = Duration::from_millis(1);

/// How long after a notification the task looks (the listener has promoted
/// the new work's groups by then), and so the least time between two looks
/// that notifications cause.
const AFTER_NOTE: Duration = Duration::from_millis(10);

/// What the watch reads and whom it wakes.
pub(crate) struct QueueTokens {
    pub pool: Pool,
    /// The queues the runner serves.
    pub queues: Vec<String>,
    /// The database has the distributed layout (Citus).
    pub distributed: bool,
    /// How long it waits when no rate-limited queue has work ready.
    pub poll_interval: Duration,
    /// How long the server gets to answer a look.
    pub round_trip: Duration,
    pub timer: Timer,
    /// Notified by the listener when it handled a notification.
    pub look: Arc<Notify>,
}

impl QueueTokens {
    /// Looks and wakes until `stop` (the lanes stop picking).
    pub(crate) async fn run(self, stop: CancellationToken) {
        let mut complaints = Complaints::new("queue tokens");
        loop {
            let look = async {
                let mut conn = pooled(&self.pool, self.round_trip).await?;
                Ok(rate_limited(&mut conn, &self.queues, self.distributed).await?)
            };
            let looked = tokio::time::timeout(self.round_trip * 2, look)
                .await
                .unwrap_or_else(|_| {
                    Err(crate::Error::Database(crate::db::error::timed_out(
                        self.round_trip * 2,
                    )))
                });
            let buckets = complaints.report(looked).unwrap_or_default();
            // Notifications matter while some queue has a rate.
            let listen = !buckets.is_empty();
            let mut next = self.poll_interval;
            for bucket in buckets.iter().filter(|b| b.ready) {
                let (wake_in, look_in) = plan(bucket);
                tracing::trace!(queue = %bucket.queue, tokens = bucket.tokens, ?wake_in,
                                "pgfifo: a rate-limited queue has work ready");
                self.timer.add(wake_in);
                next = next.min(look_in);
            }
            tokio::select! {
                () = tokio::time::sleep(next.max(MIN_LOOK)) => {}
                () = self.look.notified(), if listen => {
                    tokio::select! {
                        () = tokio::time::sleep(AFTER_NOTE) => {}
                        () = stop.cancelled() => return,
                    }
                }
                () = stop.cancelled() => return,
            }
        }
    }
}

/// For a queue with work ready: in how long to wake a lane (when its
/// bucket holds half its burst, at least one token), and in how long to
/// look again (after the time of those tokens, from the wake-up on).
fn plan(bucket: &QueueBucket) -> (Duration, Duration) {
    let per_second = bucket.per_second.max(1e-9);
    let wanted = (f64::from(bucket.burst) / 2.0).floor().max(1.0);
    let wake_in = ((wanted - bucket.tokens).max(0.0) / per_second).min(86_400.0);
    let look_in = (wake_in + wanted / per_second).min(86_400.0);
    (
        Duration::from_secs_f64(wake_in),
        Duration::from_secs_f64(look_in),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(tokens: f64, per_second: f64, burst: i32) -> QueueBucket {
        QueueBucket {
            queue: "q".into(),
            ready: true,
            tokens,
            per_second,
            burst,
        }
    }

    #[test]
    fn wakes_at_half_the_burst_and_looks_again_after_its_tokens() {
        // 50/s, burst 10, empty: 5 tokens in 100 ms; look again 100 ms later.
        let (wake, look) = plan(&bucket(0.0, 50.0, 10));
        assert_eq!(wake.as_millis(), 100);
        assert_eq!(look.as_millis(), 200);
        // Already half full: wake now.
        let (wake, look) = plan(&bucket(7.5, 50.0, 10));
        assert_eq!((wake, look.as_millis()), (Duration::ZERO, 100));
        // A burst of 1: each token.
        let (wake, look) = plan(&bucket(0.25, 4.0, 1));
        assert_eq!((wake.as_micros(), look.as_micros()), (187_500, 437_500));
        // A slow rate is looked at no later than a day from now (the poll
        // interval bounds the wait anyway).
        let (wake, _) = plan(&bucket(0.0, 1e-12, 1));
        assert_eq!(wake, Duration::from_secs(86_400));
    }
}

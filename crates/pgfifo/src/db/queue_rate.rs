//! The statement of the runner's queue-token watch
//! (`runner/queue_tokens.rs`): the rate-limited queues a runner serves,
//! whether each has work ready now, and their buckets.

use diesel::sql_types::{Array, Bool, Double, Integer, Text};
use diesel::QueryableByName;
use diesel_async::AsyncPgConnection;
use diesel_async::RunQueryDsl;

use super::pooler::pinned;
use super::statement::{bind, cached};

/// A rate-limited queue, whether it has work ready now, and its bucket.
#[derive(QueryableByName, Debug, Clone)]
pub(crate) struct QueueBucket {
    #[diesel(sql_type = Text)]
    pub queue: String,
    /// It has work that may start now.
    #[diesel(sql_type = Bool)]
    pub ready: bool,
    /// Tokens in its bucket now.
    #[diesel(sql_type = Double)]
    pub tokens: f64,
    /// Its rate, in tokens per second.
    #[diesel(sql_type = Double)]
    pub per_second: f64,
    /// Its burst: the most tokens its bucket holds.
    #[diesel(sql_type = Integer)]
    pub burst: i32,
}

/// Of `queues`, those with a rate and not paused, each with whether it has
/// a group whose head may start by its time (`ready_at` has come; it may
/// be running) or an ungrouped job that may start now. Each is an index
/// probe: the queue's limits row, then the first active group
/// (`queue_group_ready_idx`) or ungrouped job (`job_ungrouped_queued_idx`)
/// that is ready.
const RATE_LIMITED: &str = "\
SELECT c.queue,
       pgfifo.queue_bucket_tokens(c.queue, now(), c.rate_count, c.rate_period_ms,
                                  coalesce(c.burst, c.rate_count)) AS tokens,
       c.rate_count * 1000.0::float8 / c.rate_period_ms AS per_second,
       coalesce(c.burst, c.rate_count) AS burst,
       (EXISTS (SELECT 1 FROM pgfifo.queue_group AS g
                WHERE g.queue = c.queue AND g.ready_at IS NOT NULL AND g.ready_at <= now())
        OR EXISTS (SELECT 1 FROM pgfifo.job AS j
                   WHERE j.queue = c.queue AND j.state = 'queued' AND j.group_id IS NULL
                     AND j.run_after <= now())) AS ready
FROM pgfifo.queue_control AS c
WHERE c.queue = ANY ($1) AND c.rate_count IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM pgfifo.queue_setting AS s WHERE s.queue = c.queue AND s.paused)";

/// The same on the distributed layout, where the limits are tables of the
/// coordinator and the work is on the workers: a function that reads them
/// apart (`pgfifo.rate_limited_queues`, 16_queue_limits.sql).
const RATE_LIMITED_DISTRIBUTED: &str = "\
SELECT r.queue, r.tokens, r.per_second, r.burst, r.ready FROM pgfifo.rate_limited_queues($1) AS r";

/// The rate-limited queues among `queues` (not paused), and whether each
/// has work ready now; `distributed`: the database has the distributed
/// layout.
pub(crate) async fn rate_limited(
    conn: &mut AsyncPgConnection,
    queues: &[String],
    distributed: bool,
) -> diesel::QueryResult<Vec<QueueBucket>> {
    let sql = if distributed {
        RATE_LIMITED_DISTRIBUTED
    } else {
        RATE_LIMITED
    };
    pinned(conn, async |conn| {
        cached(sql, (bind::<Array<Text>, _>(queues),))
            .load(conn)
            .await
    })
    .await
}

//! The statements of [`crate::admin`]'s group listings: the groups of a
//! queue by name, oldest head or backlog, with their heads, pauses,
//! backlogs and limits. Read-only: none takes a lock or changes a row.

use diesel::sql_types::{BigInt, Bool, Double, Integer, Nullable, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::db::layout::Layout;

/// One group of a queue, with its head.
#[derive(QueryableByName, Debug)]
pub(crate) struct GroupRow {
    #[diesel(sql_type = Text)]
    pub group_id: String,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub head_id: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    pub head_state: Option<String>,
    /// The group has a ready time (it is neither idle nor held).
    #[diesel(sql_type = Bool)]
    pub active: bool,
    /// Its head waits for a time (scheduled, or its retry).
    #[diesel(sql_type = Bool)]
    pub waiting: bool,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub ready_at_us: Option<i64>,
    #[diesel(sql_type = Nullable<Integer>)]
    pub head_attempts: Option<i32>,
    #[diesel(sql_type = Nullable<Integer>)]
    pub head_max_attempts: Option<i32>,
    /// An attempt of the head started and has no outcome yet.
    #[diesel(sql_type = Bool)]
    pub head_started: bool,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub head_age_us: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    pub head_error: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub paused_at_us: Option<i64>,
    #[diesel(sql_type = BigInt)]
    pub backlog: i64,
    /// Until when the head snoozed the group (only while it sleeps).
    #[diesel(sql_type = Nullable<BigInt>)]
    pub snoozed_until_us: Option<i64>,
    /// The group's rate limit (its own, else its queue's), and tokens now.
    #[diesel(sql_type = Nullable<Integer>)]
    pub rate_count: Option<i32>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub rate_period_ms: Option<i64>,
    #[diesel(sql_type = Nullable<Integer>)]
    pub burst: Option<i32>,
    #[diesel(sql_type = Nullable<Double>)]
    pub tokens: Option<f64>,
    #[diesel(sql_type = Integer)]
    pub concurrency: i32,
    #[diesel(sql_type = Integer)]
    pub weight: i32,
    /// Jobs of the group with an attempt started and no outcome yet.
    #[diesel(sql_type = BigInt)]
    pub running: i64,
    /// The group has limits of its own (a row in pgfifo.group_control).
    #[diesel(sql_type = Bool)]
    pub own_limits: bool,
}

/// The select list and joins of a [`GroupRow`] for the groups of CTE `k`
/// (column `group_id`) in queue `$1`; a macro so that it can be `concat!`ed
/// into the statements that use it.
macro_rules! group_rows {
    () => {
"SELECT k.group_id, g.head_id, j.state AS head_state,
                g.ready_at IS NOT NULL AS active,
                coalesce(g.ready_at > now(), false) AS waiting,
                (extract(epoch FROM CASE WHEN isfinite(g.ready_at) THEN g.ready_at END)
                 * 1e6)::bigint AS ready_at_us,
                j.attempts AS head_attempts, j.max_attempts AS head_max_attempts,
                coalesce(j.state = 'queued' AND EXISTS (
                    SELECT 1 FROM pgfifo.job_attempt AS a
                    WHERE a.job_id = j.id AND a.attempt > j.attempts), false) AS head_started,
                (extract(epoch FROM now() - j.created_at) * 1e6)::bigint AS head_age_us,
                j.last_error AS head_error,
                (extract(epoch FROM p.paused_at) * 1e6)::bigint AS paused_at_us,
                (SELECT count(*) FROM pgfifo.job AS b
                 WHERE b.queue = $1 AND b.group_id = k.group_id AND b.state = 'queued') AS backlog,
                (SELECT (extract(epoch FROM z.until) * 1e6)::bigint FROM pgfifo.group_snooze AS z
                 WHERE z.queue = $1 AND z.group_id = k.group_id AND z.until > now()
                   AND z.job_id = g.head_id) AS snoozed_until_us,
                r.rate_count, r.rate_period_ms, r.burst, r.concurrency, r.weight,
                (SELECT count(*) FROM (
                     SELECT b.id, b.attempts FROM pgfifo.job AS b
                     WHERE b.queue = $1 AND b.group_id = k.group_id AND b.state = 'queued'
                     ORDER BY b.id LIMIT 2 * r.concurrency) AS b
                 WHERE EXISTS (SELECT 1 FROM pgfifo.job_attempt AS a
                               WHERE a.job_id = b.id AND a.attempt > b.attempts)) AS running,
                pgfifo.group_tokens($1, k.group_id, now()) AS tokens,
                EXISTS (SELECT 1 FROM pgfifo.group_control AS c
                        WHERE c.queue = $1 AND c.group_id = k.group_id) AS own_limits
         FROM k
         CROSS JOIN LATERAL pgfifo.group_limits($1, k.group_id) AS r
         LEFT JOIN pgfifo.queue_group AS g ON g.queue = $1 AND g.group_id = k.group_id
         LEFT JOIN pgfifo.job AS j ON j.id = g.head_id
         LEFT JOIN pgfifo.group_pause AS p ON p.queue = $1 AND p.group_id = k.group_id"
    };
}

/// `NOT $3 OR` the group is blocked (held, paused, or its head waits for
/// a retry), for a group row `g` (possibly absent) of group `$group` in
/// queue `$1`; a macro for `concat!`.
macro_rules! blocked_row {
    ($group:literal) => {
        concat!(
            "(NOT $3
              OR (g.head_id IS NOT NULL AND g.ready_at IS NULL)
              OR EXISTS (SELECT 1 FROM pgfifo.group_pause AS gp
                         WHERE gp.queue = $1 AND gp.group_id = ",
            $group,
            ")
              OR (g.ready_at > now() AND EXISTS (
                      SELECT 1 FROM pgfifo.job AS h
                      WHERE h.id = g.head_id AND h.state = 'queued' AND h.attempts > 0))
              OR EXISTS (SELECT 1 FROM pgfifo.group_snooze AS z
                         WHERE z.queue = $1 AND z.group_id = g.group_id AND z.until > now()
                           AND z.job_id = g.head_id))"
        )
    };
}

/// On the distributed layout, whether group row `g` may be blocked (held,
/// paused, or waiting for a time) when `$3` asks for blocked groups only:
/// the listing's first step keeps these, and [`each_group_row`] decides.
macro_rules! may_block {
    () => {
        "(NOT $3 OR g.ready_at IS NULL AND g.head_id IS NOT NULL OR g.ready_at > now()
          OR EXISTS (SELECT 1 FROM pgfifo.group_pause AS p
                     WHERE p.part = g.part AND p.queue = g.queue AND p.group_id = g.group_id))"
    };
}

/// On the distributed layout, the [`GroupRow`] of each group of CTE `k`
/// (column `group_id`) in queue `$1`, read by `pgfifo.group_row` on the
/// group's shard, and `NOT $3 OR` it is blocked (the same test as the
/// plain listings'); a macro for `concat!`.
macro_rules! each_group_row {
    () => {
        "SELECT r.* FROM k CROSS JOIN LATERAL pgfifo.group_row($1, k.group_id) AS r
         WHERE NOT $3
            OR r.paused_at_us IS NOT NULL
            OR (r.head_id IS NOT NULL AND NOT r.active)
            OR (r.waiting AND r.head_state = 'queued' AND r.head_attempts > 0)
            OR r.snoozed_until_us IS NOT NULL"
    };
}

/// Which groups [`groups`] reads, in name order: after `after`, starting
/// with `prefix` (`""`: any), and at most `limit`; `blocked_only` keeps
/// those that are blocked.
pub(crate) struct GroupFilter<'a> {
    pub after: Option<&'a str>,
    pub prefix: &'a str,
    pub blocked_only: bool,
    pub limit: i64,
}

/// The groups of `queue` that `filter` selects: those with a row, a pause,
/// or a wake-up not promoted yet. A prefix becomes a range on the primary
/// keys (`prefix` ≤ group < the prefix's successor), which the indexes serve.
pub(crate) async fn groups(
    conn: &mut AsyncPgConnection,
    layout: Layout,
    queue: &str,
    filter: GroupFilter<'_>,
) -> diesel::QueryResult<Vec<GroupRow>> {
    let start = match filter.after {
        Some(after) if after >= filter.prefix => after,
        _ => "",
    };
    let plain = concat!(
        "WITH k AS (
             SELECT group_id FROM pgfifo.queue_group
             WHERE queue = $1 AND group_id > $2 AND group_id >= $5
               AND ($6::text IS NULL OR group_id < $6)
             UNION
             SELECT group_id FROM pgfifo.group_pause
             WHERE queue = $1 AND group_id > $2 AND group_id >= $5
               AND ($6::text IS NULL OR group_id < $6)
             UNION
             SELECT group_id FROM pgfifo.group_wake
             WHERE queue = $1 AND group_id > $2 AND group_id >= $5
               AND ($6::text IS NULL OR group_id < $6)) ",
        group_rows!(),
        " WHERE NOT $3
            OR p.paused_at IS NOT NULL
            OR (g.head_id IS NOT NULL AND g.ready_at IS NULL)
            OR (g.ready_at > now() AND j.state = 'queued' AND j.attempts > 0)
            OR EXISTS (SELECT 1 FROM pgfifo.group_snooze AS z
                       WHERE z.queue = $1 AND z.group_id = k.group_id AND z.until > now()
                         AND z.job_id = g.head_id)
         ORDER BY k.group_id
         LIMIT $4"
    );
    let distributed = concat!(
        "WITH k AS MATERIALIZED (
             SELECT group_id FROM pgfifo.queue_group AS g
             WHERE queue = $1 AND group_id > $2 AND group_id >= $5
               AND ($6::text IS NULL OR group_id < $6) AND ",
        may_block!(),
        "
             UNION
             SELECT group_id FROM pgfifo.group_pause
             WHERE queue = $1 AND group_id > $2 AND group_id >= $5
               AND ($6::text IS NULL OR group_id < $6)
             UNION
             SELECT group_id FROM pgfifo.group_wake
             WHERE queue = $1 AND group_id > $2 AND group_id >= $5
               AND ($6::text IS NULL OR group_id < $6) AND NOT $3
             ORDER BY group_id
             LIMIT CASE WHEN $3 THEN NULL ELSE $4 END) ",
        each_group_row!(),
        " ORDER BY k.group_id
         LIMIT $4"
    );
    let text = match layout {
        Layout::Plain => plain,
        Layout::Distributed => distributed,
    };
    load_groups(conn, text, queue, &filter, start, None).await
}

/// The groups of `queue` with a head, oldest head first (the longest
/// waiting): after head `after_head`, with `filter`'s prefix, blocked-only
/// and limit (its `after` is not used). Sorts the queue's group rows (no
/// index on the head, which would cost every job's completion), which
/// stays in tens of milliseconds at 100,000 groups.
pub(crate) async fn groups_by_lag(
    conn: &mut AsyncPgConnection,
    layout: Layout,
    queue: &str,
    after_head: Option<i64>,
    filter: GroupFilter<'_>,
) -> diesel::QueryResult<Vec<GroupRow>> {
    let plain = concat!(
        "WITH k AS (
             SELECT g.group_id, g.head_id FROM pgfifo.queue_group AS g
             WHERE g.queue = $1 AND g.head_id > coalesce($7, 0)
               AND g.group_id >= $5 AND ($6::text IS NULL OR g.group_id < $6)
               AND ",
        blocked_row!("g.group_id"),
        "
             ORDER BY g.head_id
             LIMIT $4) ",
        group_rows!(),
        " ORDER BY k.head_id"
    );
    let distributed = concat!(
        "WITH k AS MATERIALIZED (
             SELECT g.group_id, g.head_id FROM pgfifo.queue_group AS g
             WHERE g.queue = $1 AND g.head_id > coalesce($7, 0)
               AND g.group_id >= $5 AND ($6::text IS NULL OR g.group_id < $6)
               AND ",
        may_block!(),
        "
             ORDER BY g.head_id
             LIMIT CASE WHEN $3 THEN NULL ELSE $4 END) ",
        each_group_row!(),
        " ORDER BY k.head_id
         LIMIT $4"
    );
    let text = match layout {
        Layout::Plain => plain,
        Layout::Distributed => distributed,
    };
    load_groups(conn, text, queue, &filter, "", after_head).await
}

/// The groups of `queue` with waiting jobs, largest backlog first (then by
/// name): after `(after_backlog, filter.after)`, with `filter`'s prefix,
/// blocked-only and limit. Counts every waiting job of the queue once per
/// call (what `status` counts too): about a tenth of a second per million
/// jobs waiting.
pub(crate) async fn groups_by_backlog(
    conn: &mut AsyncPgConnection,
    layout: Layout,
    queue: &str,
    after_backlog: Option<i64>,
    filter: GroupFilter<'_>,
) -> diesel::QueryResult<Vec<GroupRow>> {
    let plain = concat!(
        "WITH per AS (
             SELECT b.group_id, count(*) AS n FROM pgfifo.job AS b
             WHERE b.queue = $1 AND b.state = 'queued' AND b.group_id IS NOT NULL
               AND b.group_id >= $5 AND ($6::text IS NULL OR b.group_id < $6)
             GROUP BY b.group_id),
         k AS (
             SELECT per.group_id, per.n FROM per
             LEFT JOIN pgfifo.queue_group AS g ON g.queue = $1 AND g.group_id = per.group_id
             WHERE ($7::bigint IS NULL OR per.n < $7 OR (per.n = $7 AND per.group_id > $2))
               AND ",
        blocked_row!("per.group_id"),
        "
             ORDER BY per.n DESC, per.group_id
             LIMIT $4) ",
        group_rows!(),
        " ORDER BY k.n DESC, k.group_id"
    );
    let distributed = concat!(
        "WITH k AS MATERIALIZED (
             SELECT b.group_id, count(*) AS n FROM pgfifo.job AS b
             WHERE b.queue = $1 AND b.state = 'queued' AND b.group_id IS NOT NULL
               AND b.group_id >= $5 AND ($6::text IS NULL OR b.group_id < $6)
             GROUP BY b.group_id
             HAVING $7::bigint IS NULL OR count(*) < $7 OR (count(*) = $7 AND b.group_id > $2)
             ORDER BY n DESC, b.group_id
             LIMIT CASE WHEN $3 THEN NULL ELSE $4 END) ",
        each_group_row!(),
        " ORDER BY k.n DESC, k.group_id
         LIMIT $4"
    );
    let text = match layout {
        Layout::Plain => plain,
        Layout::Distributed => distributed,
    };
    let after = filter.after.unwrap_or("");
    load_groups(conn, text, queue, &filter, after, after_backlog).await
}

/// Runs one of the group listings: `$1` the queue, `$2` a group name to
/// start after, `$3` blocked only, `$4` the limit, `$5` and `$6` the
/// prefix's range, `$7` a number to start after (a head or a backlog).
/// Each statement uses the parameters it needs (their types are sent
/// with them).
async fn load_groups(
    conn: &mut AsyncPgConnection,
    text: &'static str,
    queue: &str,
    filter: &GroupFilter<'_>,
    after_name: &str,
    after_number: Option<i64>,
) -> diesel::QueryResult<Vec<GroupRow>> {
    diesel::sql_query(text)
        .bind::<Text, _>(queue)
        .bind::<Text, _>(after_name)
        .bind::<Bool, _>(filter.blocked_only)
        .bind::<BigInt, _>(filter.limit)
        .bind::<Text, _>(filter.prefix)
        .bind::<Nullable<Text>, _>(prefix_end(filter.prefix))
        .bind::<Nullable<BigInt>, _>(after_number)
        .load(conn)
        .await
}

/// The first string after every string that starts with `prefix`, in
/// byte order (the groups' collation is "C"): the prefix with its last
/// character raised by one. `None` when there is no bound (an empty prefix,
/// or one made of the highest characters only).
fn prefix_end(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let mut next = u32::from(last) + 1;
        if (0xD800..0xE000).contains(&next) {
            next = 0xE000;
        }
        if let Some(c) = char::from_u32(next) {
            chars.push(c);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

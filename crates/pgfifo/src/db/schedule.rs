//! The statements of recurring jobs: declaring schedules at start, firing
//! their ticks (the runner's scheduler), and listing and steering them
//! (the admin API). Times travel as µs since the epoch.

use std::time::Duration;

use diesel::sql_types::{Array, BigInt, Bool, Double, Integer, Jsonb, Nullable, Text};
use diesel::{OptionalExtension, QueryableByName};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::pooler::pinned;

/// `timestamptz` from µs since the epoch, exactly.
macro_rules! from_us {
    ($p:literal) => {
        concat!(
            "(timestamptz 'epoch' + ",
            $p,
            " * interval '1 microsecond')"
        )
    };
}

/// A schedule as a runner declares it.
#[derive(Debug)]
pub(crate) struct Declaration<'a> {
    pub name: &'a str,
    pub expression: &'a str,
    pub time_zone: &'a str,
    pub kind: &'a str,
    pub queue: &'a str,
    pub group: Option<&'a str>,
    pub missed: &'a str,
    pub max_catch_up: i32,
    pub definition: &'a serde_json::Value,
    pub runner: &'a str,
}

/// What declaring a schedule did.
#[derive(QueryableByName, Debug)]
pub(crate) struct Declared {
    /// It was not stored before.
    #[diesel(sql_type = Bool)]
    pub inserted: bool,
    /// The runner that declared the definition this one replaced.
    #[diesel(sql_type = Nullable<Text>)]
    pub previous_by: Option<String>,
}

/// Stores a schedule, or replaces a stored one whose definition differs.
/// Returns nothing when the stored definition is the same. A new or changed
/// schedule's ticks start after now: ticks of another definition are not
/// caught up.
pub(crate) async fn declare(
    conn: &mut AsyncPgConnection,
    d: Declaration<'_>,
) -> diesel::QueryResult<Option<Declared>> {
    pinned(conn, async |conn| {
        diesel::sql_query(
            "WITH previous AS (SELECT s.declared_by FROM pgfifo.schedule AS s WHERE s.name = $1)
             INSERT INTO pgfifo.schedule AS s (name, expression, time_zone, kind, queue, group_id,
                                               missed, max_catch_up, definition, fired_through,
                                               declared_by)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, now(), $10)
             ON CONFLICT (name) DO UPDATE
             SET expression = EXCLUDED.expression, time_zone = EXCLUDED.time_zone,
                 kind = EXCLUDED.kind, queue = EXCLUDED.queue, group_id = EXCLUDED.group_id,
                 missed = EXCLUDED.missed, max_catch_up = EXCLUDED.max_catch_up,
                 definition = EXCLUDED.definition,
                 fired_through = greatest(s.fired_through, now()),
                 declared_at = now(), declared_by = EXCLUDED.declared_by
             WHERE s.definition IS DISTINCT FROM EXCLUDED.definition
             RETURNING (SELECT p.declared_by FROM previous AS p) IS NULL AS inserted,
                       (SELECT p.declared_by FROM previous AS p) AS previous_by",
        )
        .bind::<Text, _>(d.name)
        .bind::<Text, _>(d.expression)
        .bind::<Text, _>(d.time_zone)
        .bind::<Text, _>(d.kind)
        .bind::<Text, _>(d.queue)
        .bind::<Nullable<Text>, _>(d.group)
        .bind::<Text, _>(d.missed)
        .bind::<Integer, _>(d.max_catch_up)
        .bind::<Jsonb, _>(d.definition)
        .bind::<Text, _>(d.runner)
        .get_result(conn)
        .await
        .optional()
    })
    .await
}

/// A schedule's state, as the scheduler reads it.
#[derive(QueryableByName, Debug)]
pub(crate) struct State {
    #[diesel(sql_type = Text)]
    pub name: String,
    /// Every tick up to here is dealt with.
    #[diesel(sql_type = BigInt)]
    pub fired_through_us: i64,
    #[diesel(sql_type = Bool)]
    pub paused: bool,
    /// The stored definition is the one given (another runner may have
    /// declared it differently since).
    #[diesel(sql_type = Bool)]
    pub ours: bool,
    /// The database's clock.
    #[diesel(sql_type = BigInt)]
    pub now_us: i64,
}

/// The states of schedules `names`, each compared with its definition in
/// `definitions`.
pub(crate) async fn states(
    conn: &mut AsyncPgConnection,
    names: &[&str],
    definitions: &[&serde_json::Value],
) -> diesel::QueryResult<Vec<State>> {
    pinned(conn, async |conn| {
        diesel::sql_query(
            "SELECT s.name,
                    (extract(epoch FROM s.fired_through) * 1000000)::int8 AS fired_through_us,
                    s.paused, s.definition = d.definition AS ours,
                    (extract(epoch FROM now()) * 1000000)::int8 AS now_us
             FROM unnest($1::text[], $2::jsonb[]) AS d(name, definition)
             JOIN pgfifo.schedule AS s ON s.name = d.name",
        )
        .bind::<Array<Text>, _>(names)
        .bind::<Array<Jsonb>, _>(definitions)
        .load(conn)
        .await
    })
    .await
}

/// Bounds how long a firing transaction may sit idle (a frozen runner must
/// not hold a schedule's row for long) and how long it waits for a lock.
pub(crate) async fn limit_firing(
    conn: &mut AsyncPgConnection,
    idle: Duration,
) -> diesel::QueryResult<()> {
    pinned(conn, async |conn| {
        diesel::sql_query(
            "SELECT set_config('idle_in_transaction_session_timeout', $1, true),
                    set_config('lock_timeout', $1, true)",
        )
        .bind::<Text, _>(format!("{}ms", idle.as_millis()))
        .execute(conn)
        .await
        .map(drop)
    })
    .await
}

/// Locks schedule `name`'s row for a firing, unless another firing holds
/// it (`None`, as when it is gone).
pub(crate) async fn lock(
    conn: &mut AsyncPgConnection,
    name: &str,
    definition: &serde_json::Value,
) -> diesel::QueryResult<Option<State>> {
    pinned(conn, async |conn| {
        diesel::sql_query(
            "SELECT s.name,
                    (extract(epoch FROM s.fired_through) * 1000000)::int8 AS fired_through_us,
                    s.paused, s.definition = $2 AS ours,
                    (extract(epoch FROM now()) * 1000000)::int8 AS now_us
             FROM pgfifo.schedule AS s WHERE s.name = $1
             FOR UPDATE SKIP LOCKED",
        )
        .bind::<Text, _>(name)
        .bind::<Jsonb, _>(definition)
        .get_result(conn)
        .await
        .optional()
    })
    .await
}

/// The ticks one firing enqueued, with their jobs.
#[derive(Debug, Default)]
pub(crate) struct Fired {
    pub ticks_us: Vec<i64>,
    pub job_ids: Vec<i64>,
    pub missed: Vec<i64>,
}

/// How many ticks of each schedule `schedule_tick` keeps.
const TICKS_KEPT: i64 = 100;

/// Records a firing: its ticks (a tick fired before fails the primary
/// key, and the firing rolls back), the schedule's new `fired_through`
/// and counters, and prunes old tick rows.
pub(crate) async fn record(
    conn: &mut AsyncPgConnection,
    name: &str,
    runner: &str,
    fired: &Fired,
    through_us: i64,
    missed: i64,
) -> diesel::QueryResult<()> {
    pinned(conn, async |conn| {
        if !fired.ticks_us.is_empty() {
            diesel::sql_query(concat!(
                "INSERT INTO pgfifo.schedule_tick (schedule, tick, job_id, fired_by, missed)
                 SELECT $1, ",
                from_us!("t.tick_us"),
                ", t.job_id, $2, t.missed
                 FROM unnest($3::int8[], $4::int8[], $5::int8[]) AS t(tick_us, job_id, missed)"
            ))
            .bind::<Text, _>(name)
            .bind::<Text, _>(runner)
            .bind::<Array<BigInt>, _>(&fired.ticks_us)
            .bind::<Array<BigInt>, _>(&fired.job_ids)
            .bind::<Array<BigInt>, _>(&fired.missed)
            .execute(conn)
            .await?;
            diesel::sql_query(
                "DELETE FROM pgfifo.schedule_tick AS t
                 WHERE t.schedule = $1
                   AND t.tick < (SELECT k.tick FROM pgfifo.schedule_tick AS k
                                 WHERE k.schedule = $1 ORDER BY k.tick DESC OFFSET $2 LIMIT 1)",
            )
            .bind::<Text, _>(name)
            .bind::<BigInt, _>(TICKS_KEPT - 1)
            .execute(conn)
            .await?;
        }
        diesel::sql_query(concat!(
            "UPDATE pgfifo.schedule
             SET fired_through = ",
            from_us!("$2"),
            ", missed_ticks = missed_ticks + $3,
                 last_tick = coalesce(",
            from_us!("$4"),
            ", last_tick),
                 last_job_id = coalesce($5, last_job_id),
                 last_fired_at = CASE WHEN $5 IS NULL THEN last_fired_at ELSE now() END
             WHERE name = $1"
        ))
        .bind::<Text, _>(name)
        .bind::<BigInt, _>(through_us)
        .bind::<BigInt, _>(missed)
        .bind::<Nullable<BigInt>, _>(fired.ticks_us.last().copied())
        .bind::<Nullable<BigInt>, _>(fired.job_ids.last().copied())
        .execute(conn)
        .await
        .map(drop)
    })
    .await
}

/// A stored schedule, as the admin API lists it.
#[derive(QueryableByName, Debug)]
pub(crate) struct ScheduleRow {
    #[diesel(sql_type = Text)]
    pub name: String,
    #[diesel(sql_type = Text)]
    pub expression: String,
    #[diesel(sql_type = Text)]
    pub time_zone: String,
    #[diesel(sql_type = Text)]
    pub kind: String,
    #[diesel(sql_type = Text)]
    pub queue: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub group_id: Option<String>,
    #[diesel(sql_type = Text)]
    pub missed: String,
    #[diesel(sql_type = Integer)]
    pub max_catch_up: i32,
    #[diesel(sql_type = Bool)]
    pub paused: bool,
    #[diesel(sql_type = BigInt)]
    pub fired_through_us: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub last_tick_us: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub last_fired_at_us: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub last_job_id: Option<i64>,
    /// The last job's state; `None` when it was purged.
    #[diesel(sql_type = Nullable<Text>)]
    pub last_job_state: Option<String>,
    #[diesel(sql_type = BigInt)]
    pub missed_ticks: i64,
    #[diesel(sql_type = BigInt)]
    pub declared_at_us: i64,
    #[diesel(sql_type = Text)]
    pub declared_by: String,
    /// Live runners that declare the stored definition.
    #[diesel(sql_type = Array<Text>)]
    pub live_runners: Vec<String>,
}

/// Every stored schedule (or the one named), by name. A runner counts as
/// live while its heartbeat is younger than `alive`.
pub(crate) async fn list(
    conn: &mut AsyncPgConnection,
    name: Option<&str>,
    alive: Duration,
) -> diesel::QueryResult<Vec<ScheduleRow>> {
    pinned(conn, async |conn| {
        diesel::sql_query(
            "SELECT s.name, s.expression, s.time_zone, s.kind, s.queue, s.group_id, s.missed,
                    s.max_catch_up, s.paused,
                    (extract(epoch FROM s.fired_through) * 1000000)::int8 AS fired_through_us,
                    (extract(epoch FROM s.last_tick) * 1000000)::int8 AS last_tick_us,
                    (extract(epoch FROM s.last_fired_at) * 1000000)::int8 AS last_fired_at_us,
                    s.last_job_id, j.state AS last_job_state, s.missed_ticks,
                    (extract(epoch FROM s.declared_at) * 1000000)::int8 AS declared_at_us,
                    s.declared_by,
                    ARRAY(SELECT r.name FROM pgfifo.runner AS r
                          WHERE r.heartbeat_at > now() - make_interval(secs => $2)
                            AND r.schedules -> s.name = s.definition
                          ORDER BY r.name) AS live_runners
             FROM pgfifo.schedule AS s
             LEFT JOIN pgfifo.job AS j ON j.id = s.last_job_id
             WHERE $1::text IS NULL OR s.name = $1
             ORDER BY s.name",
        )
        .bind::<Nullable<Text>, _>(name)
        .bind::<Double, _>(alive.as_secs_f64())
        .load(conn)
        .await
    })
    .await
}

/// A fired tick, as the admin API lists it.
#[derive(QueryableByName, Debug)]
pub(crate) struct TickRow {
    #[diesel(sql_type = BigInt)]
    pub tick_us: i64,
    #[diesel(sql_type = BigInt)]
    pub job_id: i64,
    #[diesel(sql_type = BigInt)]
    pub fired_at_us: i64,
    #[diesel(sql_type = Text)]
    pub fired_by: String,
    #[diesel(sql_type = BigInt)]
    pub missed: i64,
}

/// The latest `limit` fired ticks of schedule `name`, newest first.
pub(crate) async fn recent_ticks(
    conn: &mut AsyncPgConnection,
    name: &str,
    limit: i64,
) -> diesel::QueryResult<Vec<TickRow>> {
    pinned(conn, async |conn| {
        diesel::sql_query(
            "SELECT (extract(epoch FROM t.tick) * 1000000)::int8 AS tick_us, t.job_id,
                    (extract(epoch FROM t.fired_at) * 1000000)::int8 AS fired_at_us,
                    t.fired_by, t.missed
             FROM pgfifo.schedule_tick AS t WHERE t.schedule = $1
             ORDER BY t.tick DESC LIMIT $2",
        )
        .bind::<Text, _>(name)
        .bind::<BigInt, _>(limit)
        .load(conn)
        .await
    })
    .await
}

#[derive(QueryableByName)]
struct Changed {
    #[diesel(sql_type = Bool)]
    changed: bool,
}

/// Pauses (`true`) or resumes schedule `name`; `None` when there is no such
/// schedule, else whether it changed. Resuming moves the schedule past the
/// ticks that passed while it was paused.
pub(crate) async fn set_paused(
    conn: &mut AsyncPgConnection,
    name: &str,
    paused: bool,
) -> diesel::QueryResult<Option<bool>> {
    pinned(conn, async |conn| {
        let row: Option<Changed> = diesel::sql_query(
            "WITH before AS (SELECT s.paused FROM pgfifo.schedule AS s WHERE s.name = $1)
             UPDATE pgfifo.schedule AS s
             SET paused = $2,
                 fired_through = CASE WHEN s.paused AND NOT $2
                                      THEN greatest(s.fired_through, now())
                                      ELSE s.fired_through END
             WHERE s.name = $1
             RETURNING (SELECT b.paused FROM before AS b) IS DISTINCT FROM $2 AS changed",
        )
        .bind::<Text, _>(name)
        .bind::<Bool, _>(paused)
        .get_result(conn)
        .await
        .optional()?;
        Ok(row.map(|r| r.changed))
    })
    .await
}

/// Deletes schedule `name` (with its tick history) unless a live runner
/// declares it; the names of those runners otherwise. `None`: no such
/// schedule.
pub(crate) async fn delete(
    conn: &mut AsyncPgConnection,
    name: &str,
    alive: Duration,
) -> diesel::QueryResult<Option<Vec<String>>> {
    pinned(conn, async |conn| {
        #[derive(QueryableByName)]
        struct Deleted {
            #[diesel(sql_type = Array<Text>)]
            live_runners: Vec<String>,
        }
        let row: Option<Deleted> = diesel::sql_query(
            "WITH target AS (
                 SELECT s.name, ARRAY(SELECT r.name FROM pgfifo.runner AS r
                                      WHERE r.heartbeat_at > now() - make_interval(secs => $2)
                                        AND r.schedules -> s.name = s.definition
                                      ORDER BY r.name) AS live_runners
                 FROM pgfifo.schedule AS s WHERE s.name = $1 FOR UPDATE),
             gone AS (DELETE FROM pgfifo.schedule AS s USING target AS t
                      WHERE s.name = t.name AND cardinality(t.live_runners) = 0)
             SELECT t.live_runners FROM target AS t",
        )
        .bind::<Text, _>(name)
        .bind::<Double, _>(alive.as_secs_f64())
        .get_result(conn)
        .await
        .optional()?;
        Ok(row.map(|r| r.live_runners))
    })
    .await
}

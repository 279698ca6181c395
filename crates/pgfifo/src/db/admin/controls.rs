//! The statements of [`crate::admin`]'s group limits: one call of
//! `pgfifo.set_group_control` or `pgfifo.change_group_control`
//! (`db/functions/15_controls.sql`), and reading the rows they write.

use diesel::sql_types::{Array, BigInt, Bool, Integer, Nullable, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

/// Limits as `pgfifo.set_group_control` takes them: rate count and period
/// (both or neither) and burst; `None` inherits, or means no limit.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ControlValues {
    pub rate_count: Option<i32>,
    pub rate_period_ms: Option<i64>,
    pub burst: Option<i32>,
    pub concurrency: Option<i32>,
    pub weight: Option<i32>,
}

#[derive(QueryableByName)]
struct Found {
    #[diesel(sql_type = Bool)]
    found: bool,
}

/// Sets (or with `reset`, deletes) the limits of `group` in `queue`
/// (`None`: the queue's defaults). Returns whether a row was there.
pub(crate) async fn set_group_control(
    conn: &mut AsyncPgConnection,
    queue: &str,
    group: Option<&str>,
    values: ControlValues,
    reset: bool,
) -> diesel::QueryResult<bool> {
    let row: Found = diesel::sql_query(
        "SELECT pgfifo.set_group_control($1, $2, $3, $4, $5, $6, $7, $8) AS found",
    )
    .bind::<Text, _>(queue)
    .bind::<Nullable<Text>, _>(group)
    .bind::<Nullable<Integer>, _>(values.rate_count)
    .bind::<Nullable<BigInt>, _>(values.rate_period_ms)
    .bind::<Nullable<Integer>, _>(values.burst)
    .bind::<Nullable<Integer>, _>(values.concurrency)
    .bind::<Nullable<Integer>, _>(values.weight)
    .bind::<Bool, _>(reset)
    .get_result(conn)
    .await?;
    Ok(row.found)
}

/// Changes the limits named in `change` (`"rate"`, `"burst"`,
/// `"concurrency"`, `"weight"`) of `group` in `queue` (`None`: the queue's
/// defaults) to `values`, keeping the others, in one statement. Returns the
/// row as it is now, `None` when nothing is left set (the row is gone).
pub(crate) async fn change_group_control(
    conn: &mut AsyncPgConnection,
    queue: &str,
    group: Option<&str>,
    change: &[&str],
    values: ControlValues,
) -> diesel::QueryResult<Option<ControlRow>> {
    let rows: Vec<ControlRow> = diesel::sql_query(
        "SELECT group_id, rate_count, rate_period_ms, burst, concurrency, weight \
         FROM pgfifo.change_group_control($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind::<Text, _>(queue)
    .bind::<Nullable<Text>, _>(group)
    .bind::<Array<Text>, _>(change)
    .bind::<Nullable<Integer>, _>(values.rate_count)
    .bind::<Nullable<BigInt>, _>(values.rate_period_ms)
    .bind::<Nullable<Integer>, _>(values.burst)
    .bind::<Nullable<Integer>, _>(values.concurrency)
    .bind::<Nullable<Integer>, _>(values.weight)
    .load(conn)
    .await?;
    Ok(rows.into_iter().next())
}

/// One row of `pgfifo.group_control`: `group_id` is `""` for the queue's
/// defaults.
#[derive(QueryableByName, Debug)]
pub(crate) struct ControlRow {
    #[diesel(sql_type = Text)]
    pub group_id: String,
    #[diesel(sql_type = Nullable<Integer>)]
    pub rate_count: Option<i32>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub rate_period_ms: Option<i64>,
    #[diesel(sql_type = Nullable<Integer>)]
    pub burst: Option<i32>,
    #[diesel(sql_type = Nullable<Integer>)]
    pub concurrency: Option<i32>,
    #[diesel(sql_type = Nullable<Integer>)]
    pub weight: Option<i32>,
}

/// The limits set in `queue`: its defaults first (if set), then the groups
/// with limits of their own, by name, after `after`, at most `limit`.
pub(crate) async fn controls(
    conn: &mut AsyncPgConnection,
    queue: &str,
    after: Option<&str>,
    limit: i64,
) -> diesel::QueryResult<Vec<ControlRow>> {
    diesel::sql_query(
        "SELECT group_id, rate_count, rate_period_ms, burst, concurrency, weight
         FROM pgfifo.group_control
         WHERE queue = $1 AND ($2::text IS NULL OR group_id > $2)
         ORDER BY group_id LIMIT $3",
    )
    .bind::<Text, _>(queue)
    .bind::<Nullable<Text>, _>(after)
    .bind::<BigInt, _>(limit)
    .load(conn)
    .await
}

/// The row of `group` in `queue` (`""`: the queue's defaults), if any.
pub(crate) async fn control(
    conn: &mut AsyncPgConnection,
    queue: &str,
    group: &str,
) -> diesel::QueryResult<Option<ControlRow>> {
    use diesel::OptionalExtension;
    diesel::sql_query(
        "SELECT group_id, rate_count, rate_period_ms, burst, concurrency, weight
         FROM pgfifo.group_control WHERE queue = $1 AND group_id = $2",
    )
    .bind::<Text, _>(queue)
    .bind::<Text, _>(group)
    .get_result(conn)
    .await
    .optional()
}

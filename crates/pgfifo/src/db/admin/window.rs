//! The de-duplication window a job carries, for the job view.

use diesel::sql_types::{BigInt, Bool, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

/// A job's window (`pgfifo.window_of_job`).
#[derive(QueryableByName, Debug)]
pub(crate) struct WindowRow {
    #[diesel(sql_type = Text)]
    pub key: String,
    #[diesel(sql_type = Text)]
    pub mode: String,
    #[diesel(sql_type = BigInt)]
    pub period_us: i64,
    #[diesel(sql_type = BigInt)]
    pub until_us: i64,
    #[diesel(sql_type = Bool)]
    pub holds: bool,
}

/// The window job `id` carries, if any.
pub(crate) async fn window_of_job(
    conn: &mut AsyncPgConnection,
    id: i64,
) -> diesel::QueryResult<Option<WindowRow>> {
    let rows: Vec<WindowRow> = diesel::sql_query(
        "SELECT w.key, w.mode, w.period_us, w.until_us, w.holds FROM pgfifo.window_of_job($1) AS w",
    )
    .bind::<BigInt, _>(id)
    .load(conn)
    .await?;
    Ok(rows.into_iter().next())
}

//! The statements of the distributed layout ([`crate::migrate::distribute`],
//! docs/scaling.md): which layout a database has, whether Citus is
//! there, and the layout's DDL (`distribute.sql`).

use diesel::sql_types::{Nullable, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

use crate::db::layout::Layout;

/// Adds the part to every row, rebuilds the keys around it and spreads the
/// tables over the cluster.
const DISTRIBUTE: &str = include_str!("distribute.sql");

#[derive(QueryableByName)]
struct Found {
    #[diesel(sql_type = Nullable<Text>)]
    found: Option<String>,
}

/// Whether the database's pgfifo tables have the distributed layout:
/// `pgfifo.schema_layout` records it (plain otherwise).
pub(crate) async fn distributed(conn: &mut AsyncPgConnection) -> diesel::QueryResult<bool> {
    let row: Found = diesel::sql_query("SELECT to_regclass('pgfifo.schema_layout')::text AS found")
        .get_result(conn)
        .await?;
    if row.found.is_none() {
        return Ok(false);
    }
    let row: Found = diesel::sql_query("SELECT max(layout) AS found FROM pgfifo.schema_layout")
        .get_result(conn)
        .await?;
    Ok(row.found.as_deref() == Some("distributed"))
}

/// The database's layout (see [`distributed`]): what an operator's
/// statements take to choose their form (`db::layout::expand`).
pub(crate) async fn layout(conn: &mut AsyncPgConnection) -> diesel::QueryResult<Layout> {
    Ok(if distributed(conn).await? {
        Layout::Distributed
    } else {
        Layout::Plain
    })
}

/// The version of the citus extension in this database, if it has one.
pub(crate) async fn citus_version(
    conn: &mut AsyncPgConnection,
) -> diesel::QueryResult<Option<String>> {
    let row: Found = diesel::sql_query(
        "SELECT max(extversion) AS found FROM pg_extension WHERE extname = 'citus'",
    )
    .get_result(conn)
    .await?;
    Ok(row.found)
}

/// Whether this session is on a Citus worker rather than the coordinator
/// (the coordinator has node group 0).
pub(crate) async fn on_worker(conn: &mut AsyncPgConnection) -> diesel::QueryResult<bool> {
    let row: Found =
        diesel::sql_query("SELECT max((groupid <> 0)::text) AS found FROM pg_dist_local_group")
            .get_result(conn)
            .await?;
    Ok(row.found.as_deref() == Some("true"))
}

/// The queues where a group's weight above 1 is set (weights do not run on
/// the distributed layout: a queue's shares are compared across all its
/// groups, on every shard), in order, joined with ", "; `None` if none.
pub(crate) async fn weighted_queues(
    conn: &mut AsyncPgConnection,
) -> diesel::QueryResult<Option<String>> {
    let row: Found = diesel::sql_query(
        "SELECT string_agg(DISTINCT queue, ', ' ORDER BY queue) AS found \
         FROM pgfifo.group_control WHERE weight > 1",
    )
    .get_result(conn)
    .await?;
    Ok(row.found)
}

/// Lays the tables out over the cluster (`distribute.sql`), in the
/// caller's transaction.
pub(crate) async fn distribute(conn: &mut AsyncPgConnection) -> diesel::QueryResult<()> {
    conn.batch_execute(DISTRIBUTE).await
}

//! One-value queries on any connection, for assertions: the tests' own SQL,
//! never pgfifo's.

use diesel::sql_types::{BigInt, Nullable, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

/// Runs `sql` on `conn` and returns the single bigint it yields.
pub async fn scalar(conn: &mut AsyncPgConnection, sql: &str) -> i64 {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = BigInt)]
        v: i64,
    }
    let row: Row = diesel::sql_query(format!("SELECT ({sql})::bigint AS v"))
        .get_result(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    row.v
}

/// Runs `sql` on `conn` and returns the single text it yields (NULL as
/// `None`).
pub async fn text(conn: &mut AsyncPgConnection, sql: &str) -> Option<String> {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = Nullable<Text>)]
        v: Option<String>,
    }
    let row: Row = diesel::sql_query(format!("SELECT ({sql})::text AS v"))
        .get_result(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    row.v
}

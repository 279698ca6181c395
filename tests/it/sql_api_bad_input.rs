//! Bad input to the SQL API (`pgfifo.add_job`, `pgfifo.add_jobs`): each bad
//! field is a clear error (SQLSTATE 22023, constraint `pgfifo_bad_job`, the
//! field as the error's column) and nothing is written.

use diesel::result::Error as DieselError;
use diesel::sql_types::{Nullable, Text};
use diesel_async::RunQueryDsl;
use pgfifo_tests::TestDb;

/// A call with one bound text value `$1` and the field it must be blamed on.
struct Bad {
    sql: &'static str,
    value: Option<&'static str>,
    field: &'static str,
    says: &'static str,
}

const fn bad(
    sql: &'static str,
    value: Option<&'static str>,
    field: &'static str,
    says: &'static str,
) -> Bad {
    Bad {
        sql,
        value,
        field,
        says,
    }
}

#[tokio::test]
async fn each_bad_field_is_a_clear_error_and_writes_nothing() {
    let db = TestDb::new().await;
    let long_queue: &'static str = "q".repeat(129).leak();
    let long_name: &'static str = "g".repeat(257).leak();
    let cases = [
        bad("SELECT pgfifo.add_job(kind => $1, queue => 'q', payload => '{}')", Some(""), "kind", "kind must be a job kind of 1 to 256 bytes"),
        bad("SELECT pgfifo.add_job(kind => $1, queue => 'q', payload => '{}')", None, "kind", "kind must be"),
        bad("SELECT pgfifo.add_job(kind => $1, queue => 'q', payload => '{}')", Some(long_name), "kind", "kind must be"),
        bad("SELECT pgfifo.add_job(kind => 'K', queue => $1, payload => '{}')", Some(""), "queue", "queue must be a queue name of 1 to 128 bytes"),
        bad("SELECT pgfifo.add_job(kind => 'K', queue => $1, payload => '{}')", Some(long_queue), "queue", "queue must be"),
        bad("SELECT pgfifo.add_job(kind => 'K', queue => $1, payload => '{}')", None, "queue", "queue must be"),
        bad("SELECT pgfifo.add_job(kind => 'K', queue => 'q', payload => $1::jsonb)", None, "payload", "payload must be a JSON value"),
        bad("SELECT pgfifo.add_job(kind => 'K', queue => 'q', payload => '{}', group_id => $1)", Some(""), "group_id", "group_id must be NULL"),
        bad("SELECT pgfifo.add_job(kind => 'K', queue => 'q', payload => '{}', group_id => $1)", Some(long_name), "group_id", "1 to 256 bytes"),
        bad("SELECT pgfifo.add_job(kind => 'K', queue => 'q', payload => '{}', unique_key => $1)", Some(""), "unique_key", "unique_key must be NULL"),
        bad("SELECT pgfifo.add_job(kind => 'K', queue => 'q', payload => '{}', unique_key => $1)", Some(long_name), "unique_key", "unique_key must be"),
        bad("SELECT pgfifo.add_job(kind => 'K', queue => 'q', payload => '{}', priority => $1::integer)", Some("32768"), "priority", "priority must be between -32768 and 32767"),
        bad("SELECT pgfifo.add_job(kind => 'K', queue => 'q', payload => '{}', priority => $1::integer)", Some("-32769"), "priority", "priority must be"),
        bad("SELECT pgfifo.add_job(kind => 'K', queue => 'q', payload => '{}', max_attempts => $1::integer)", Some("0"), "max_attempts", "max_attempts must be at least 1"),
        bad("SELECT pgfifo.add_job(kind => 'K', queue => 'q', payload => '{}', delay => $1::interval)", Some("-1 second"), "delay", "delay must not be negative"),
        bad("SELECT pgfifo.add_job(kind => 'K', queue => 'q', payload => '{}', delay => $1::interval)", Some("178000000 years"), "delay", "delay is too long"),
        bad("SELECT pgfifo.add_job(kind => 'K', queue => 'q', payload => '{}', run_at => $1::timestamptz)", Some("infinity"), "run_at", "run_at must be a finite time"),
        bad("SELECT pgfifo.add_job(kind => 'K', queue => 'q', payload => '{}', run_at => now(), delay => $1::interval)", Some("1 minute"), "run_at", "run_at and delay are both given"),
        bad("SELECT pgfifo.add_jobs(jobs => $1::jsonb)", None, "jobs", "jobs must be a JSON array of objects (got SQL NULL)"),
        bad("SELECT pgfifo.add_jobs(jobs => $1::jsonb)", Some(r#"{"kind": "K"}"#), "jobs", "jobs must be a JSON array of objects (got object)"),
        bad("SELECT pgfifo.add_jobs(jobs => $1::jsonb)", Some(r#"[{"kind": "K", "queue": "q", "payload": 1}, 7]"#), "jobs", "jobs[1] must be a JSON object (got number)"),
        bad("SELECT pgfifo.add_jobs(jobs => $1::jsonb)", Some(r#"[{"kind": "K", "queue": "q", "payload": 1, "group": "g"}]"#), "group", "jobs[0].group is not a field of a job"),
        bad("SELECT pgfifo.add_jobs(jobs => $1::jsonb)", Some(r#"[{"kind": "K", "queue": "q"}]"#), "payload", "jobs[0].payload is missing"),
        bad("SELECT pgfifo.add_jobs(jobs => $1::jsonb)", Some(r#"[{"kind": 5, "queue": "q", "payload": 1}]"#), "kind", "jobs[0].kind must be a JSON string (got number)"),
        bad("SELECT pgfifo.add_jobs(jobs => $1::jsonb)", Some(r#"[{"kind": "K", "queue": "q", "payload": 1, "priority": "high"}]"#), "priority", "jobs[0].priority must be a whole number"),
        bad("SELECT pgfifo.add_jobs(jobs => $1::jsonb)", Some(r#"[{"kind": "K", "queue": "q", "payload": 1, "max_attempts": 2.5}]"#), "max_attempts", "jobs[0].max_attempts must be a whole number"),
        bad("SELECT pgfifo.add_jobs(jobs => $1::jsonb)", Some(r#"[{"kind": "K", "queue": "q", "payload": 1, "run_at": "soon"}]"#), "run_at", "jobs[0].run_at must be a time"),
        bad("SELECT pgfifo.add_jobs(jobs => $1::jsonb)", Some(r#"[{"kind": "K", "queue": "q", "payload": 1, "delay": [1]}]"#), "delay", "jobs[0].delay must be an interval"),
        // A bad job after good ones: none is written.
        bad("SELECT pgfifo.add_jobs(jobs => $1::jsonb)", Some(r#"[{"kind": "K", "queue": "q", "payload": 1, "group_id": "g"}, {"kind": "K", "queue": "q", "payload": 2, "priority": 40000}]"#), "priority", "jobs[1].priority must be between -32768 and 32767"),
        bad("SELECT pgfifo.add_jobs(jobs => $1::jsonb)", Some(r#"[{"kind": "K", "queue": "", "payload": 1}]"#), "queue", "jobs[0].queue must be a queue name"),
    ];
    let mut conn = db.direct().await;
    for case in &cases {
        let result = diesel::sql_query(case.sql)
            .bind::<Nullable<Text>, _>(case.value)
            .execute(&mut conn)
            .await;
        let shown = case.value.map(|v| v.chars().take(40).collect::<String>());
        match result {
            Err(DieselError::DatabaseError(_, info)) => {
                assert!(
                    info.message().starts_with("pgfifo: ") && info.message().contains(case.says),
                    "{} with {shown:?}: expected {:?} in {:?}",
                    case.sql,
                    case.says,
                    info.message()
                );
                assert_eq!(
                    info.constraint_name(),
                    Some("pgfifo_bad_job"),
                    "{}",
                    case.sql
                );
                assert_eq!(
                    info.column_name(),
                    Some(case.field),
                    "{} with {shown:?}",
                    case.sql
                );
            }
            other => panic!(
                "{} with {shown:?}: expected an error, got {other:?}",
                case.sql
            ),
        }
    }
    for table in ["job", "queue_group", "group_wake"] {
        assert_eq!(
            db.scalar(&format!("SELECT count(*) FROM pgfifo.{table}"))
                .await,
            0,
            "nothing written to pgfifo.{table}"
        );
    }
    // The SQLSTATE, as a client in another language sees it (diesel keeps
    // the constraint and column names, not the code).
    db.exec(
        "CREATE FUNCTION sqlstate_of(p_sql text) RETURNS text LANGUAGE plpgsql AS $$ \
         BEGIN EXECUTE p_sql; RETURN '00000'; \
         EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE; END $$",
    )
    .await;
    for call in [
        "SELECT pgfifo.add_job(kind => ''K'', queue => ''q'', payload => ''{}'', priority => 99999)",
        "SELECT pgfifo.add_jobs(''[{\"kind\": \"K\", \"queue\": \"q\", \"payload\": 1, \"delay\": -5}]'')",
    ] {
        assert_eq!(
            db.text(&format!("SELECT sqlstate_of('{call}')")).await.as_deref(),
            Some("22023"),
            "{call}"
        );
    }
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job").await, 0);
}

//! The trace contexts of jobs in SQL (migration 0009, docs/tracing.md): the
//! overload of `pgfifo.enqueue` that stores them, what it refuses, what it
//! does without the table, and retention.

use std::time::Duration;

use diesel_async::RunQueryDsl;
use pgfifo::admin::{self, FinishedState};
use pgfifo_tests::TestDb;

const TP1: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const TP2: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";

/// A call of the eleven-argument `pgfifo.enqueue` for ungrouped jobs of
/// queue `q` (one per element of `traceparents`, a SQL array), returning
/// the ids as text.
fn traced_enqueue(traceparents: &str, tracestates: &str, unique_keys: &str) -> String {
    format!(
        "SELECT pgfifo.enqueue(
             array_fill('q'::text, ARRAY[cardinality({traceparents}::text[])]),
             array_fill(NULL::text, ARRAY[cardinality({traceparents}::text[])]),
             array_fill('k'::text, ARRAY[cardinality({traceparents}::text[])]),
             array_fill('{{}}'::jsonb, ARRAY[cardinality({traceparents}::text[])]),
             array_fill(0::smallint, ARRAY[cardinality({traceparents}::text[])]),
             array_fill(3, ARRAY[cardinality({traceparents}::text[])]),
             {unique_keys}::text[],
             array_fill(NULL::bigint, ARRAY[cardinality({traceparents}::text[])]),
             array_fill(NULL::bigint, ARRAY[cardinality({traceparents}::text[])]),
             {traceparents}::text[], {tracestates}::text[])::text"
    )
}

async fn error_of(db: &TestDb, sql: &str) -> String {
    let mut conn = db.conn().await;
    match diesel::sql_query(sql).execute(&mut *conn).await {
        Ok(_) => panic!("{sql} succeeded"),
        Err(err) => err.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overload_stores_each_jobs_context_and_nothing_for_null() {
    let db = TestDb::new().await;
    let ids = db
        .text(&traced_enqueue(
            &format!("ARRAY['{TP1}', NULL, '{TP2}']"),
            "ARRAY['vendor=a', NULL, '']",
            "NULL",
        ))
        .await
        .expect("ids");
    let ids: Vec<i64> = ids
        .trim_matches(|c| c == '{' || c == '}')
        .split(',')
        .map(|id| id.parse().unwrap())
        .collect();
    assert_eq!(ids.len(), 3);
    let stored = db
        .text(
            "SELECT string_agg(t.traceparent || ' ' || coalesce(t.tracestate, '-'), ',' ORDER BY j.id)
             FROM pgfifo.job AS j JOIN pgfifo.job_trace AS t ON t.job_id = j.id",
        )
        .await;
    assert_eq!(stored, Some(format!("{TP1} vendor=a,{TP2} -")));
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job_trace WHERE job_id = {}",
            ids[1]
        ))
        .await,
        0,
        "no row for the job without a context"
    );
    // Without tracestates (NULL array), and all traceparents NULL: the plain
    // enqueue, nothing stored.
    db.text(&traced_enqueue("ARRAY[NULL, NULL]", "NULL", "NULL"))
        .await;
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job").await, 5);
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job_trace").await, 2);
}

/// A row whose unique key is taken returns the holder's id and leaves the
/// holder's context (or its lack of one) as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_unique_key_keeps_the_holders_context() {
    let db = TestDb::new().await;
    let first = db
        .text(&traced_enqueue(
            &format!("ARRAY['{TP1}']"),
            "NULL",
            "ARRAY['key-1']",
        ))
        .await;
    let plain = db
        .text(&traced_enqueue("ARRAY[NULL]", "NULL", "ARRAY['key-2']"))
        .await;
    let again = db
        .text(&traced_enqueue(
            &format!("ARRAY['{TP2}', '{TP2}']"),
            "NULL",
            "ARRAY['key-1', 'key-2']",
        ))
        .await
        .expect("ids");
    let first = first
        .unwrap()
        .trim_matches(|c| c == '{' || c == '}')
        .to_owned();
    let plain = plain
        .unwrap()
        .trim_matches(|c| c == '{' || c == '}')
        .to_owned();
    assert_eq!(again, format!("{{{first},{plain}}}"), "the holders' ids");
    assert_eq!(
        db.text("SELECT string_agg(job_id || ' ' || traceparent, ',') FROM pgfifo.job_trace")
            .await,
        Some(format!("{first} {TP1}")),
        "the holder of key-1 keeps its context, key-2's gets none"
    );
}

/// Bad input is refused with a clear error and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_trace_contexts_are_refused_and_nothing_is_written() {
    let db = TestDb::new().await;
    let err = error_of(
        &db,
        &traced_enqueue("ARRAY['not-a-traceparent']", "NULL", "NULL"),
    )
    .await;
    assert!(err.contains("job_trace_traceparent_check"), "{err}");
    let err = error_of(
        &db,
        &traced_enqueue(&format!("ARRAY['{}']", TP1.to_uppercase()), "NULL", "NULL"),
    )
    .await;
    assert!(err.contains("job_trace_traceparent_check"), "{err}");
    // One traceparent for two jobs.
    let err = error_of(
        &db,
        &traced_enqueue(&format!("ARRAY['{TP1}']"), "NULL", "NULL").replacen(
            &format!("ARRAY['{TP1}']::text[], NULL::text[]"),
            &format!("ARRAY['{TP1}', '{TP2}']::text[], ARRAY['a']::text[]"),
            1,
        ),
    )
    .await;
    assert!(
        err.contains("1 jobs but 2 traceparents and 1 tracestates"),
        "{err}"
    );
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job").await, 0);
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job_trace").await, 0);
}

/// Without the table (as while `migrate down` drops it), the overload
/// enqueues all the same, without the contexts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_table_the_overload_still_enqueues() {
    let db = TestDb::new().await;
    db.exec("DROP TABLE pgfifo.job_trace").await;
    let ids = db
        .text(&traced_enqueue(&format!("ARRAY['{TP1}']"), "NULL", "NULL"))
        .await;
    assert!(ids.is_some());
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job").await, 1);
    // And retention runs without it.
    let mut conn = db.conn().await;
    admin::purge(&mut conn, Duration::ZERO, &[FinishedState::Succeeded])
        .await
        .unwrap();
}

/// Retention deletes the contexts of the jobs it deletes, and only those.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_takes_the_contexts_of_purged_jobs_with_them() {
    let db = TestDb::new().await;
    db.text(&traced_enqueue(
        &format!("ARRAY['{TP1}', '{TP2}', '{TP1}']"),
        "NULL",
        "NULL",
    ))
    .await;
    // The first two finished two days ago; the third is still queued.
    db.exec(
        "UPDATE pgfifo.job SET state = 'succeeded', finished_at = now() - interval '2 days'
         WHERE id IN (SELECT id FROM pgfifo.job ORDER BY id LIMIT 2)",
    )
    .await;
    let mut conn = db.conn().await;
    let deleted = admin::purge(
        &mut conn,
        Duration::from_secs(86_400),
        &[FinishedState::Succeeded],
    )
    .await
    .unwrap();
    assert_eq!(deleted, 2);
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM pgfifo.job_trace AS t
             WHERE EXISTS (SELECT 1 FROM pgfifo.job AS j WHERE j.id = t.job_id AND j.state = 'queued')"
        )
        .await,
        1
    );
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job_trace").await, 1);
}

/// The SQL API for other languages takes a job's context as optional
/// trailing parameters (`add_job`) or fields (`add_jobs`), and stores it as
/// the traced overload does; a tracestate without a traceparent is refused
/// and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sql_api_stores_the_context_it_is_given() {
    let db = TestDb::new().await;
    let one = db
        .text(&format!(
            "SELECT pgfifo.add_job(kind => 'k', queue => 'q', payload => '{{}}', \
             group_id => 'g', traceparent => '{TP1}', tracestate => 'vendor=a')::text"
        ))
        .await
        .expect("id");
    let plain = db
        .text("SELECT pgfifo.add_job(kind => 'k', queue => 'q', payload => '{}')::text")
        .await
        .expect("id");
    let many = db
        .text(&format!(
            "SELECT pgfifo.add_jobs('[{{\"kind\": \"k\", \"queue\": \"q\", \"payload\": {{}}, \
             \"traceparent\": \"{TP2}\"}}, {{\"kind\": \"k\", \"queue\": \"q\", \"payload\": 1}}]')::text"
        ))
        .await
        .expect("ids");
    let second: Vec<&str> = many
        .trim_matches(|c| c == '{' || c == '}')
        .split(',')
        .collect();
    let stored = db
        .text(
            "SELECT string_agg(job_id || ' ' || traceparent || ' ' || coalesce(tracestate, '-'), ',' \
             ORDER BY job_id) FROM pgfifo.job_trace",
        )
        .await;
    assert_eq!(
        stored.as_deref(),
        Some(format!("{one} {TP1} vendor=a,{} {TP2} -", second[0]).as_str()),
        "contexts of {plain} (none) and {many}"
    );
    // With a window: the job it creates keeps the context; a call folded
    // into that job stores nothing.
    let windowed = |tp: &str| {
        format!(
            "SELECT pgfifo.add_job(kind => 'k', queue => 'q', payload => '{{}}', \
             traceparent => '{tp}', window_key => 'w', window_mode => 'unique', \
             window_period => '1 hour')::text"
        )
    };
    let first = db.text(&windowed(TP1)).await.expect("id");
    let again = db.text(&windowed(TP2)).await.expect("id");
    assert_eq!(first, again, "the window folded the second call");
    assert_eq!(
        db.text(&format!(
            "SELECT string_agg(traceparent, ',') FROM pgfifo.job_trace WHERE job_id = {first}"
        ))
        .await
        .as_deref(),
        Some(TP1)
    );
    let err = error_of(
        &db,
        "SELECT pgfifo.add_job(kind => 'k', queue => 'q', payload => '{}', tracestate => 'x=y')",
    )
    .await;
    assert!(
        err.contains("tracestate is given without a traceparent"),
        "{err}"
    );
    let err = error_of(
        &db,
        "SELECT pgfifo.add_job(kind => 'k', queue => 'q', payload => '{}', traceparent => 'bad')",
    )
    .await;
    assert!(err.contains("job_trace_traceparent_check"), "{err}");
    assert_eq!(
        db.text("SELECT count(*)::text FROM pgfifo.job")
            .await
            .as_deref(),
        Some("5"),
        "the refused calls wrote nothing"
    );
}

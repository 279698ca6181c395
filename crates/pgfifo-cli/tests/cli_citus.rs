//! `pgfifo migrate distribute` on a private Citus cluster (a coordinator and
//! two workers, `pgfifo_tests::citus::Cluster`). Ignored: it needs Citus
//! (`scripts/citus-build.sh`); `.ci/run` runs it with the Citus suite.

// Each test binary uses part of the shared support.
#[allow(dead_code, unused_imports)]
mod support;

use pgfifo_tests::citus::Cluster;

use support::pgfifo;

#[tokio::test]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn migrate_distribute_lays_the_tables_out_once_and_only_on_the_coordinator() {
    let cluster = Cluster::start().await.expect("start the Citus cluster");
    let url = cluster.url();
    let worker = cluster.workers[0].url("postgres");

    // Before the schema exists: refused, nothing laid out.
    let early = pgfifo(Some(&url), &["migrate", "distribute"]).expect(1);
    assert!(early.stderr.contains("migrate"), "{}", early.stderr);

    pgfifo(Some(&url), &["migrate", "up"]).expect(0);
    // On a worker: refused, naming the coordinator.
    let refused = pgfifo(Some(&worker), &["migrate", "distribute"]).expect(1);
    assert!(refused.stderr.contains("coordinator"), "{}", refused.stderr);

    let done = pgfifo(Some(&url), &["migrate", "distribute", "--json"])
        .expect(0)
        .json();
    assert_eq!(done["layout"], "distributed");
    assert_eq!(done["changed"], true);
    let text = pgfifo(Some(&url), &["migrate", "distribute"])
        .expect(0)
        .stdout;
    assert!(text.contains("already distributed"), "{text}");
    let status = pgfifo(Some(&url), &["migrate", "status"]).expect(0).stdout;
    assert!(status.contains("layout: distributed"), "{status}");
    // The job table is spread over the cluster.
    let mut conn = cluster.coordinator_conn().await.expect("coordinator");
    assert_eq!(
        pgfifo_tests::query::scalar(
            &mut conn,
            "SELECT count(*) FROM citus_tables WHERE table_name = 'pgfifo.job'::regclass"
        )
        .await,
        1
    );
}

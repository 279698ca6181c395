//! `fifo-groups` on a Citus cluster (`CITUS=1`): `DATABASE_URL` names the
//! coordinator (`scripts/citus-cluster.sh start` prints it). The scenario's
//! database is recreated on every node of the cluster, the extension created
//! in it, the workers joined to the coordinator in it, and pgfifo migrated
//! then distributed (`pgfifo::migrate::distribute`, see `docs/scaling.md`).
//!
//! With `CITUS=0` against the same coordinator, the database is a plain
//! one on that server (its settings are the cluster's): the comparison
//! `docs/scaling.md` quotes. Either way the report adds each node's
//! PostgreSQL CPU per job ([`NodeCpu`]).

use diesel::sql_types::{BigInt, Bool, Integer, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use pgfifo::Pool;
use serde_json::json;

use crate::common::{self, database_url};

/// One node of the cluster as the coordinator lists it.
#[derive(QueryableByName, Debug, Clone)]
pub struct NodeRow {
    #[diesel(sql_type = Text)]
    pub host: String,
    #[diesel(sql_type = Integer)]
    pub port: i32,
    /// The coordinator (group 0) rather than a worker.
    #[diesel(sql_type = Bool)]
    pub coordinator: bool,
}

impl NodeRow {
    /// A URL for database `db` on this node, with the user of `server_url`.
    pub fn url(&self, server_url: &str, db: &str) -> String {
        let after_scheme = server_url.find("://").map_or(0, |i| i + 3);
        let rest = &server_url[after_scheme..];
        let user = rest
            .split_once('@')
            .filter(|(user, _)| !user.contains('/'))
            .map(|(user, _)| format!("{user}@"))
            .unwrap_or_default();
        format!(
            "{}{user}{}:{}/{db}",
            &server_url[..after_scheme],
            self.host,
            self.port
        )
    }

    /// How the report names the node.
    pub fn name(&self) -> String {
        if self.coordinator {
            format!("coordinator:{}", self.port)
        } else {
            format!("worker:{}", self.port)
        }
    }
}

/// The active primaries of the cluster at `server_url`, the coordinator
/// first.
pub async fn nodes(server_url: &str) -> Result<Vec<NodeRow>, String> {
    let mut conn = AsyncPgConnection::establish(server_url)
        .await
        .map_err(|e| format!("connect to {server_url}: {e}"))?;
    diesel::sql_query(
        "SELECT nodename AS host, nodeport AS port, groupid = 0 AS coordinator
         FROM pg_dist_node WHERE noderole = 'primary' AND isactive
         ORDER BY groupid",
    )
    .load(&mut conn)
    .await
    .map_err(|e| {
        format!(
            "CITUS=1: {server_url} is not a Citus coordinator ({e}); \
             start a cluster with scripts/citus-cluster.sh"
        )
    })
}

/// Recreates database `name` on every node of `nodes`, joins the workers
/// to the coordinator in it, migrates and distributes pgfifo's schema, and
/// returns a pool of `pool_size` connections to it on the coordinator.
pub async fn fresh_database(
    server_url: &str,
    nodes: &[NodeRow],
    name: &str,
    pool_size: u32,
) -> Result<(Pool, String), String> {
    let coordinator = nodes
        .iter()
        .find(|n| n.coordinator)
        .ok_or("CITUS=1: the cluster lists no coordinator (citus_set_coordinator_host)")?;
    // The coordinator's database first: its connections to the workers'
    // databases end with it.
    for node in std::iter::once(coordinator).chain(nodes.iter().filter(|n| !n.coordinator)) {
        let mut admin = establish(&node.url(server_url, "postgres")).await?;
        common::recreate(&mut admin, name)
            .await
            .map_err(|e| format!("on {}: {e}", node.name()))?;
    }
    for node in nodes.iter().filter(|n| !n.coordinator) {
        let mut conn = establish(&node.url(server_url, name)).await?;
        conn.batch_execute("CREATE EXTENSION citus")
            .await
            .map_err(|e| format!("CREATE EXTENSION citus on {}: {e}", node.name()))?;
    }
    let url = coordinator.url(server_url, name);
    let mut conn = establish(&url).await?;
    conn.batch_execute("CREATE EXTENSION citus")
        .await
        .map_err(|e| format!("CREATE EXTENSION citus on the coordinator: {e}"))?;
    join(&mut conn, "citus_set_coordinator_host", coordinator).await?;
    for worker in nodes.iter().filter(|n| !n.coordinator) {
        join(&mut conn, "citus_add_node", worker).await?;
    }
    let pool = pgfifo::connect(&url, pool_size)
        .await
        .map_err(|e| e.to_string())?;
    pgfifo::migrate(&pool).await.map_err(|e| e.to_string())?;
    pgfifo::migrate::distribute(&mut conn)
        .await
        .map_err(|e| format!("distribute: {e}"))?;
    conn.batch_execute(&format!(
        "ALTER DATABASE \"{name}\" SET citus.enable_stat_counters = on"
    ))
    .await
    .map_err(|e| format!("enable Citus's statement counters: {e}"))?;
    Ok((pool, url))
}

async fn establish(url: &str) -> Result<AsyncPgConnection, String> {
    AsyncPgConnection::establish(url)
        .await
        .map_err(|e| format!("connect to {url}: {e}"))
}

/// `SELECT function(host, port)`: the coordinator learns a node.
async fn join(conn: &mut AsyncPgConnection, function: &str, node: &NodeRow) -> Result<(), String> {
    #[derive(QueryableByName)]
    struct One {
        #[diesel(sql_type = BigInt)]
        #[allow(dead_code)]
        n: i64,
    }
    diesel::sql_query(format!("SELECT 1::bigint AS n FROM {function}($1, $2)"))
        .bind::<Text, _>(&node.host)
        .bind::<Integer, _>(node.port)
        .load::<One>(conn)
        .await
        .map(drop)
        .map_err(|e| format!("{function} for {}: {e}", node.name()))
}

/// The share of the queue's jobs on each worker, in percent, by port.
pub async fn split(conn: &mut AsyncPgConnection, queue: &str) -> Result<serde_json::Value, String> {
    #[derive(QueryableByName)]
    struct Share {
        #[diesel(sql_type = Integer)]
        port: i32,
        #[diesel(sql_type = diesel::sql_types::Double)]
        percent: f64,
    }
    let shares: Vec<Share> = diesel::sql_query(
        "SELECT port, round(100.0 * n / sum(n) OVER (), 1)::float8 AS percent
         FROM (SELECT p.nodeport AS port, count(*) AS n FROM pgfifo.job AS j
               JOIN pg_dist_shard_placement AS p
                 ON p.shardid = get_shard_id_for_distribution_column('pgfifo.job', j.part)
               WHERE j.queue = $1 GROUP BY 1) AS w
         ORDER BY port",
    )
    .bind::<Text, _>(queue)
    .load(conn)
    .await
    .map_err(|e| format!("read the jobs' split: {e}"))?;
    Ok(shares
        .into_iter()
        .map(|s| (format!("worker:{}", s.port), json!(s.percent)))
        .collect::<serde_json::Map<_, _>>()
        .into())
}

/// Citus's statement counts in this database since its counters were
/// reset: (routed to one shard, run on several). (Those of the databases a
/// run dropped before stay in the server's sum: this one's are read.)
pub async fn statements(conn: &mut AsyncPgConnection) -> Result<(i64, i64), String> {
    #[derive(QueryableByName)]
    struct Counts {
        #[diesel(sql_type = BigInt)]
        single: i64,
        #[diesel(sql_type = BigInt)]
        multi: i64,
    }
    let c: Counts = diesel::sql_query(
        "SELECT coalesce(sum(query_execution_single_shard), 0)::bigint AS single,
                coalesce(sum(query_execution_multi_shard), 0)::bigint AS multi
         FROM citus_stat_counters((SELECT oid FROM pg_database WHERE datname = current_database()))",
    )
    .get_result(conn)
    .await
    .map_err(|e| format!("read citus_stat_counters: {e}"))?;
    Ok((c.single, c.multi))
}

/// Resets Citus's statement counters.
pub async fn reset_statements(conn: &mut AsyncPgConnection) -> Result<(), String> {
    conn.batch_execute("SELECT citus_stat_counters_reset()")
        .await
        .map_err(|e| format!("reset citus_stat_counters: {e}"))
}

/// The scenario's database on each node, for [`NodeCpu`] readings: the
/// plain database alone (`CITUS=0`), or every node of the cluster.
pub fn database_urls(server_url: &str, nodes: &[NodeRow], name: &str) -> Vec<(String, String)> {
    if nodes.is_empty() {
        return vec![("server".to_owned(), database_url(server_url, name))];
    }
    nodes
        .iter()
        .map(|n| (n.name(), n.url(server_url, name)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_urls_keep_the_user_and_scheme() {
        let node = NodeRow {
            host: "10.0.0.2".into(),
            port: 5702,
            coordinator: false,
        };
        assert_eq!(
            node.url("postgres://postgres@127.0.0.1:5701/postgres", "b"),
            "postgres://postgres@10.0.0.2:5702/b"
        );
        assert_eq!(
            node.url("postgresql://127.0.0.1:5701/postgres", "b"),
            "postgresql://10.0.0.2:5702/b"
        );
    }
}

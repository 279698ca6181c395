//! A private Citus cluster for the Citus suite (`tests/citus/`): a
//! coordinator and two workers, each a private server of
//! [`failover::Node`](crate::failover::Node) on a free port of 127.0.0.1,
//! with `shared_preload_libraries = 'citus'` and the extension created in
//! their `postgres` database. The coordinator knows itself
//! (`citus_set_coordinator_host`) and the two workers (`citus_add_node`).
//!
//! The system server on 5432 is never touched: Citus must be installed in
//! its lib and share directories (`scripts/citus-build.sh` does it), but
//! only these private servers load it. They are stopped and their files
//! deleted when the [`Cluster`] is dropped, also when a test panics.

use std::time::Duration;

use diesel::sql_types::{BigInt, Integer, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

use crate::failover::Node;

/// The settings every node of the cluster starts with.
const SETTINGS: &str = "shared_preload_libraries = 'citus'\n\
    max_connections = 200\nmax_prepared_transactions = 200\nshared_buffers = 64MB\n\
    citus.node_conninfo = 'sslmode=prefer'\n\
    citus.max_cached_conns_per_worker = 4\n";

/// The database the cluster is set up in (Citus's extension lives per
/// database; `CREATE DATABASE` is not propagated by default).
pub const DB: &str = "postgres";

/// A coordinator and two workers.
#[derive(Debug)]
pub struct Cluster {
    /// The coordinator: the application's URL points here.
    pub coordinator: Node,
    /// The two workers, in the order they were added.
    pub workers: Vec<Node>,
}

/// One row of `pg_dist_node` as the coordinator sees it.
#[derive(QueryableByName, Debug, PartialEq, Eq)]
pub struct NodeRow {
    /// `pg_dist_node.nodeport`.
    #[diesel(sql_type = Integer)]
    pub port: i32,
    /// `pg_dist_node.noderole`.
    #[diesel(sql_type = Text)]
    pub role: String,
    /// `pg_dist_node.shouldhaveshards`.
    #[diesel(sql_type = diesel::sql_types::Bool)]
    pub has_shards: bool,
}

impl Cluster {
    /// Starts the three servers, creates the extension on each and joins
    /// the workers to the coordinator. Fails with a message naming what
    /// went wrong (a missing `citus.so` says how to build it).
    pub async fn start() -> Result<Cluster, String> {
        let bin = std::path::PathBuf::from(
            std::env::var("PG_BIN").unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".to_owned()),
        );
        let library = bin.with_file_name("lib").join("citus.so");
        if !library.exists() {
            return Err(format!(
                "{} is missing: Citus is not installed for this server; run scripts/citus-build.sh",
                library.display()
            ));
        }
        let coordinator = Node::initdb("citus-coordinator", SETTINGS)?;
        let workers = vec![
            Node::initdb("citus-worker1", SETTINGS)?,
            Node::initdb("citus-worker2", SETTINGS)?,
        ];
        let cluster = Cluster {
            coordinator,
            workers,
        };
        for node in std::iter::once(&cluster.coordinator).chain(&cluster.workers) {
            let mut conn = connect(node).await?;
            conn.batch_execute("CREATE EXTENSION IF NOT EXISTS citus")
                .await
                .map_err(|e| format!("CREATE EXTENSION citus on port {}: {e}", node.port()))?;
        }
        let mut coord = cluster.coordinator_conn().await?;
        exec_int(
            &mut coord,
            "SELECT citus_set_coordinator_host('127.0.0.1', $1)",
            i32::from(cluster.coordinator.port()),
        )
        .await?;
        for worker in &cluster.workers {
            exec_int(
                &mut coord,
                "SELECT citus_add_node('127.0.0.1', $1)",
                i32::from(worker.port()),
            )
            .await?;
        }
        Ok(cluster)
    }

    /// The application's URL: the coordinator's `postgres` database.
    pub fn url(&self) -> String {
        self.coordinator.url(DB)
    }

    /// A direct connection to the coordinator.
    pub async fn coordinator_conn(&self) -> Result<AsyncPgConnection, String> {
        connect(&self.coordinator).await
    }

    /// A direct connection to worker `i` (0 or 1).
    pub async fn worker_conn(&self, i: usize) -> Result<AsyncPgConnection, String> {
        connect(&self.workers[i]).await
    }

    /// The nodes the coordinator knows, by port.
    pub async fn nodes(&self) -> Result<Vec<NodeRow>, String> {
        let mut conn = self.coordinator_conn().await?;
        diesel::sql_query(
            "SELECT nodeport AS port, noderole::text AS role, shouldhaveshards AS has_shards
             FROM pg_dist_node ORDER BY nodeport",
        )
        .load(&mut conn)
        .await
        .map_err(|e| format!("read pg_dist_node: {e}"))
    }
}

async fn connect(node: &Node) -> Result<AsyncPgConnection, String> {
    let url = node.url(DB);
    let began = std::time::Instant::now();
    loop {
        match AsyncPgConnection::establish(&url).await {
            Ok(conn) => return Ok(conn),
            Err(e) if began.elapsed() > Duration::from_secs(30) => {
                return Err(format!("connect to {url}: {e}"))
            }
            // pg_ctl -w returned, but a restarted server may still be in
            // crash recovery: its state, not a timer, ends the wait.
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

async fn exec_int(conn: &mut AsyncPgConnection, sql: &str, arg: i32) -> Result<(), String> {
    #[derive(QueryableByName)]
    struct Any {
        #[diesel(sql_type = BigInt)]
        #[allow(dead_code)]
        n: i64,
    }
    diesel::sql_query(format!("SELECT 1::bigint AS n FROM ({sql}) AS s"))
        .bind::<Integer, _>(arg)
        .load::<Any>(conn)
        .await
        .map(drop)
        .map_err(|e| format!("{sql} ({arg}): {e}"))
}

/// The CPU time (user + system, in clock ticks of 10 ms) that the
/// processes of `node`'s postmaster have used so far: its backends and
/// background workers, read from `/proc`. A process that exited is no
/// longer counted, so measure across a run whose connections stay open.
pub fn cpu_ticks(node: &Node) -> u64 {
    let Some(postmaster) = node.postmaster_pid() else {
        return 0;
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut ticks = 0;
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().parse::<u32>().is_err() {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid … utime stime: fields 4, 14 and 15.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(1).and_then(|p| p.parse::<u32>().ok()) != Some(postmaster) {
            continue;
        }
        let field = |i: usize| {
            fields
                .get(i)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        ticks += field(11) + field(12);
    }
    ticks
}

/// Like [`cpu_ticks`], plus the postmaster's own CPU and that of the
/// processes that exited (its `cutime` and `cstime`, counted when it
/// reaped them): Citus closes the extra connections it opened to the
/// workers once a transaction ends, and their work counts too. (A process
/// that exited but is not reaped yet is counted by neither; compare two
/// readings with `saturating_sub`.)
pub fn cpu_ticks_all(node: &Node) -> u64 {
    let live = cpu_ticks(node);
    let Some(postmaster) = node.postmaster_pid() else {
        return live;
    };
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{postmaster}/stat")) else {
        return live;
    };
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return live;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime stime cutime cstime: fields 14 to 17 (11 to 14 after the comm).
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    live + field(11) + field(12) + field(13) + field(14)
}

//! Reading a database URL and opening one connection to the first server
//! of it that answers in time.
//!
//! A URL may name several hosts (`postgres://u@a:5432,b:5432/app`, or
//! `host=a,b port=5432,5432` in key-value form), as libpq and
//! tokio-postgres allow, with `target_session_attrs=read-write` to skip
//! servers that take no writes (a standby). tokio-postgres tries the hosts
//! in turn itself, but its `connect_timeout` bounds only each TCP connect:
//! a host that accepts the connection and then never answers its start-up
//! exchange (a frozen postmaster, a stalled machine, a half-open path
//! through a proxy) holds the attempt, and the next host is never tried.
//! So pgfifo parses the URL with [`tokio_postgres::Config`] and connects to
//! one host at a time, each within a deadline of its own that covers the
//! TCP connect, the start-up exchange and the read-write check. pgfifo's
//! setup statements after that have a longer bound of their own
//! ([`SETUP_PATIENCE`]): a pooler may make them wait for a free server.
//!
//! A host that failed (refused, hung, took no writes) is tried after the
//! others for [`FAILED_HOST_LAST`]: after a failover, the first new
//! connection finds out that the old primary hangs, and the next ones go
//! straight to the new one instead of each waiting out the deadline.
//!
//! pgfifo reads one parameter of its own from the URL, [`POOLER_FLAG`]
//! (`pgbouncer=true`, as Prisma spells it): the URL leads to a pooler in
//! transaction mode. It is removed before the URL reaches tokio-postgres,
//! which refuses parameters it does not know.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::{ConnectionError, ConnectionResult};
use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use tokio_postgres::config::{Host, LoadBalanceHosts, TargetSessionAttrs};
use tokio_postgres::Config;

use super::pooler;

/// The URL parameter that says the URL leads to a pooler in transaction
/// mode (`?pgbouncer=true`): the name Prisma gives it. Its value is `true`
/// or `false`.
pub const POOLER_FLAG: &str = "pgbouncer";

/// Server-side TCP keepalives put on every direct connection: a peer that
/// vanished from the network (a dead machine, a partition) is noticed
/// within about 25 s, its session ends and its jobs' locks are released. A
/// frozen process is caught by the idle bound of each job's transaction
/// instead (its kernel still answers keepalives).
const KEEPALIVES: &str =
    "SET tcp_keepalives_idle = 10; SET tcp_keepalives_interval = 5; SET tcp_keepalives_count = 3";

/// Fails with SQLSTATE 25006 (read_only_sql_transaction) on a server that
/// takes no writes: the pool's check of a connection whose URL asks for a
/// writable server. One simple-protocol statement, so it goes through a
/// transaction-mode pooler as well.
const CHECK_WRITABLE: &str = "DO $$BEGIN IF current_setting('transaction_read_only')::boolean \
     THEN RAISE EXCEPTION 'the server takes no writes' USING ERRCODE = '25006'; END IF; END$$";

/// The pool's check of a connection that may take any server.
const CHECK: &str = "SELECT 1";

/// How long pgfifo's setup of a connection (after the start-up exchange)
/// may take: long, since a pooler may hold it back while it waits for a
/// free server connection, but bounded, so that a connection the pool
/// is opening never waits forever on a server that hung a moment after
/// answering.
const SETUP_PATIENCE: Duration = Duration::from_secs(60);

/// How long a host that failed is tried after the others.
pub(crate) const FAILED_HOST_LAST: Duration = Duration::from_secs(30);

/// A database URL, read.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    /// The URL without pgfifo's own parameter.
    pub(crate) url: String,
    /// What tokio-postgres reads from it.
    pub(crate) config: Config,
    /// The URL carries [`POOLER_FLAG`]`=true`.
    pub(crate) transaction_pooler: bool,
    /// When each host that failed last failed (shared by the copies of
    /// this target).
    failed: Arc<Mutex<HashMap<String, Instant>>>,
}

impl Target {
    /// Reads `url`: a `postgres://` / `postgresql://` URL or a key-value
    /// string, with pgfifo's [`POOLER_FLAG`] taken out.
    pub(crate) fn parse(url: &str) -> ConnectionResult<Target> {
        let (url, transaction_pooler) = take_pooler_flag(url)?;
        let config: Config = url.parse().map_err(|err: tokio_postgres::Error| {
            ConnectionError::InvalidConnectionUrl(err.to_string())
        })?;
        Ok(Target {
            url,
            config,
            transaction_pooler,
            failed: Arc::default(),
        })
    }

    /// Whether only a server that takes writes will do.
    pub(crate) fn wants_writable(&self) -> bool {
        self.config.get_target_session_attrs() == TargetSessionAttrs::ReadWrite
    }

    /// The statement that checks a pooled connection before it is handed out.
    pub(crate) fn check(&self) -> &'static str {
        if self.wants_writable() {
            CHECK_WRITABLE
        } else {
            CHECK
        }
    }
}

/// Takes `pgbouncer=...` out of `url`: the URL without it, and whether it
/// said `true`.
fn take_pooler_flag(url: &str) -> ConnectionResult<(String, bool)> {
    let bad_value = |value: &str| {
        ConnectionError::InvalidConnectionUrl(format!(
            "{POOLER_FLAG}={value}: the value must be true or false"
        ))
    };
    let read = |value: &str| match value.to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(bad_value(value)),
    };
    let mut flag = false;
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let Some((base, query)) = url.split_once('?') else {
            return Ok((url.to_owned(), false));
        };
        let mut kept = Vec::new();
        for pair in query.split('&') {
            match pair.split_once('=') {
                Some((POOLER_FLAG, value)) => flag = read(value)?,
                _ if pair == POOLER_FLAG => return Err(bad_value("")),
                _ => kept.push(pair),
            }
        }
        let url = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        return Ok((url, flag));
    }
    // Key-value form: `host=a port=5432 pgbouncer=true`. (The flag's value
    // is never quoted; other values may be, and are kept as they are.)
    let flag_key = format!("{POOLER_FLAG}=");
    let mut kept = Vec::new();
    for word in url.split(' ') {
        match word.strip_prefix(&flag_key) {
            Some(value) => flag = read(value)?,
            None => kept.push(word),
        }
    }
    Ok((kept.join(" "), flag))
}

/// Why no host gave a connection.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Every host accepted or ignored the attempt and none answered within
    /// the deadline.
    TimedOut(Duration),
    /// At least one host refused or failed: every host's reason.
    Failed(ConnectionError),
}

impl From<Failure> for ConnectionError {
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::TimedOut(deadline) => ConnectionError::BadConnection(format!(
                "the database server did not answer within {deadline:?}"
            )),
            Failure::Failed(err) => err,
        }
    }
}

/// Opens one connection to the first host of `target` that answers within
/// `per_host` and suits its `target_session_attrs`, trying them in the
/// URL's order (or at random with `load_balance_hosts=random`). `pooled`:
/// the connection goes through a transaction-mode pooler and is set up for
/// one ([`pooler::setup`]); otherwise it gets the TCP keepalive settings.
pub(crate) async fn open(
    target: &Target,
    per_host: Duration,
    pooled: bool,
) -> Result<AsyncPgConnection, Failure> {
    let mut hosts = one_per_host(&target.config);
    let several = hosts.len() > 1;
    if several {
        // Hosts that failed lately last, the others in their order.
        let failed = target.failed.lock().unwrap_or_else(|e| e.into_inner());
        hosts.sort_by_key(|(name, _)| {
            failed
                .get(name)
                .is_some_and(|at| at.elapsed() < FAILED_HOST_LAST)
        });
    }
    let note = |name: &String, failed: bool| {
        if several {
            let mut hosts = target.failed.lock().unwrap_or_else(|e| e.into_inner());
            if failed {
                hosts.insert(name.clone(), Instant::now());
            } else {
                hosts.remove(name);
            }
        }
    };
    let mut reasons = Vec::new();
    let mut all_timed_out = true;
    for (name, config) in &hosts {
        match open_one(config, per_host, pooled).await {
            Ok(mut conn) => {
                note(name, false);
                pooler::mark_host(&mut conn, name);
                return Ok(conn);
            }
            Err(Some(err)) => {
                all_timed_out = false;
                reasons.push((name, err.to_string()));
            }
            Err(None) => reasons.push((
                name,
                format!("the server did not answer within {per_host:?}"),
            )),
        }
        note(name, true);
        if hosts.len() > 1 {
            tracing::debug!(host = %name, reason = %reasons[reasons.len() - 1].1, "pgfifo: trying the next host");
        }
    }
    if all_timed_out {
        return Err(Failure::TimedOut(per_host));
    }
    let message = match reasons.as_slice() {
        [(_, reason)] => reason.clone(),
        _ => reasons
            .iter()
            .map(|(name, reason)| format!("{name}: {reason}"))
            .collect::<Vec<_>>()
            .join("; "),
    };
    Err(Failure::Failed(ConnectionError::BadConnection(message)))
}

/// [`open`], for bb8's `custom_setup`: `target` shared by every connection
/// of the pool.
pub(crate) async fn open_for_pool(
    target: Arc<Target>,
    per_host: Duration,
    pooled: bool,
) -> ConnectionResult<AsyncPgConnection> {
    open(&target, per_host, pooled).await.map_err(Into::into)
}

/// Connects to one host within `per_host` and sets the connection up.
/// `Err(None)`: the host did not answer in time.
///
/// The deadline covers the TCP connect, the start-up exchange and the
/// read-write check, which a live server answers at once; not pgfifo's
/// setup statements after them, which a pooler may hold back while it
/// waits for a free server connection (PgBouncer queues a client for up to
/// its `query_wait_timeout`).
async fn open_one(
    config: &Config,
    per_host: Duration,
    pooled: bool,
) -> Result<AsyncPgConnection, Option<ConnectionError>> {
    // tokio-postgres checks `target_session_attrs` itself (`SHOW
    // transaction_read_only`), for this one host.
    let connect = config.connect(tokio_postgres::NoTls);
    let (client, connection) = tokio::time::timeout(per_host, connect)
        .await
        .map_err(|_| None)?
        .map_err(|err| {
            Some(ConnectionError::BadConnection(super::error::with_causes(
                &err,
            )))
        })?;
    let setup = async {
        if pooled {
            return pooler::setup(client, connection).await;
        }
        let mut conn =
            AsyncPgConnection::try_from_client_and_connection(client, connection).await?;
        conn.batch_execute(KEEPALIVES)
            .await
            .map_err(ConnectionError::CouldntSetupConfiguration)?;
        Ok(conn)
    };
    match tokio::time::timeout(SETUP_PATIENCE, setup).await {
        Ok(set_up) => set_up.map_err(Some),
        Err(_) => Err(Some(ConnectionError::BadConnection(format!(
            "the connection was not set up within {SETUP_PATIENCE:?} of the server's answer"
        )))),
    }
}

/// `config` split into one configuration per host, named for messages, in
/// the order to try them.
fn one_per_host(config: &Config) -> Vec<(String, Config)> {
    let hosts = config.get_hosts();
    let addrs = config.get_hostaddrs();
    let ports = config.get_ports();
    let count = hosts.len().max(addrs.len());
    if count <= 1 {
        // Nothing to split (or nothing to connect to: tokio-postgres says so).
        return vec![(
            describe(hosts.first(), addrs.first(), ports.first()),
            config.clone(),
        )];
    }
    let mut order: Vec<usize> = (0..count).collect();
    if config.get_load_balance_hosts() == LoadBalanceHosts::Random {
        use std::hash::{BuildHasher, Hasher};
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        order.rotate_left((random % count as u64) as usize);
    }
    order
        .into_iter()
        .map(|i| {
            let port = ports.get(i).or_else(|| ports.first());
            let mut one = settings_of(config);
            match hosts.get(i) {
                Some(Host::Tcp(name)) => {
                    one.host(name);
                }
                #[cfg(unix)]
                Some(Host::Unix(path)) => {
                    one.host_path(path);
                }
                None => {}
            }
            if let Some(addr) = addrs.get(i) {
                one.hostaddr(*addr);
            }
            if let Some(port) = port {
                one.port(*port);
            }
            (describe(hosts.get(i), addrs.get(i), port), one)
        })
        .collect()
}

/// Everything of `config` but its hosts and ports.
fn settings_of(config: &Config) -> Config {
    let mut one = Config::new();
    if let Some(user) = config.get_user() {
        one.user(user);
    }
    if let Some(password) = config.get_password() {
        one.password(password);
    }
    if let Some(dbname) = config.get_dbname() {
        one.dbname(dbname);
    }
    if let Some(options) = config.get_options() {
        one.options(options);
    }
    if let Some(name) = config.get_application_name() {
        one.application_name(name);
    }
    if let Some(timeout) = config.get_connect_timeout() {
        one.connect_timeout(*timeout);
    }
    if let Some(timeout) = config.get_tcp_user_timeout() {
        one.tcp_user_timeout(*timeout);
    }
    if let Some(interval) = config.get_keepalives_interval() {
        one.keepalives_interval(interval);
    }
    if let Some(retries) = config.get_keepalives_retries() {
        one.keepalives_retries(retries);
    }
    one.ssl_mode(config.get_ssl_mode())
        .ssl_negotiation(config.get_ssl_negotiation())
        .keepalives(config.get_keepalives())
        .keepalives_idle(config.get_keepalives_idle())
        .target_session_attrs(config.get_target_session_attrs())
        .channel_binding(config.get_channel_binding());
    one
}

/// `host:port` for messages.
fn describe(host: Option<&Host>, addr: Option<&std::net::IpAddr>, port: Option<&u16>) -> String {
    let host = match (host, addr) {
        (Some(Host::Tcp(name)), _) => name.clone(),
        #[cfg(unix)]
        (Some(Host::Unix(path)), _) => path.display().to_string(),
        (None, Some(addr)) => addr.to_string(),
        (None, None) => "localhost".to_owned(),
    };
    format!("{host}:{}", port.copied().unwrap_or(5432))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts_of(url: &str) -> Vec<String> {
        one_per_host(&Target::parse(url).unwrap().config)
            .into_iter()
            .map(|(name, config)| {
                assert_eq!(config.get_dbname(), Some("app"));
                assert_eq!(config.get_user(), Some("u"));
                name
            })
            .collect()
    }

    #[test]
    fn the_pooler_flag_is_read_and_taken_out() {
        let target = Target::parse("postgres://u@db:6432/app?pgbouncer=true").unwrap();
        assert!(target.transaction_pooler);
        assert_eq!(target.url, "postgres://u@db:6432/app");
        let target =
            Target::parse("postgres://u@db/app?sslmode=disable&pgbouncer=TRUE&connect_timeout=3")
                .unwrap();
        assert!(target.transaction_pooler);
        assert_eq!(
            target.url,
            "postgres://u@db/app?sslmode=disable&connect_timeout=3"
        );
        let target = Target::parse("postgres://u@db/app?pgbouncer=false").unwrap();
        assert!(!target.transaction_pooler);
        let target = Target::parse("host=db user=u dbname=app pgbouncer=true").unwrap();
        assert!(target.transaction_pooler);
        assert_eq!(target.url, "host=db user=u dbname=app");
        assert!(
            !Target::parse("postgres://u@db/app")
                .unwrap()
                .transaction_pooler
        );
        assert!(Target::parse("postgres://u@db/app?pgbouncer=yes").is_err());
        assert!(Target::parse("postgres://u@db/app?pgbouncer").is_err());
    }

    #[test]
    fn a_multi_host_url_is_split_per_host_in_order() {
        assert_eq!(
            hosts_of("postgres://u@a:5433,b:5434/app?target_session_attrs=read-write"),
            ["a:5433", "b:5434"]
        );
        assert_eq!(
            hosts_of("host=a,b port=5440 user=u dbname=app"),
            ["a:5440", "b:5440"]
        );
        assert_eq!(hosts_of("postgres://u@a/app"), ["a:5432"]);
        let target = Target::parse("postgres://u@a,b/app?target_session_attrs=read-write").unwrap();
        assert!(target.wants_writable());
        assert_eq!(target.check(), CHECK_WRITABLE);
        let split = one_per_host(&target.config);
        assert!(split
            .iter()
            .all(|(_, c)| c.get_target_session_attrs() == TargetSessionAttrs::ReadWrite));
        assert_eq!(Target::parse("postgres://u@a/app").unwrap().check(), CHECK);
    }
}

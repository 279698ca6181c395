//! A private PgBouncer in front of a test's database: one pool in
//! transaction mode and one in session mode, on a port of its own.
//!
//! The instance runs as a child process with its files in a temporary
//! directory, and stops when the [`PgBouncer`] is dropped; the system's
//! PgBouncer configuration is never touched. Its transaction pool hands out
//! server connections in turn (`server_round_robin`), so a statement that
//! relies on landing on the same server twice fails at once, not only under
//! load.
//!
//! PgBouncer comes from Debian's `pgbouncer` package (`.ci/run` installs
//! it). Without it, [`PgBouncer::start`] returns `None` and the tests say
//! so and pass, unless `PGFIFO_REQUIRE_PGBOUNCER=1` (set by `.ci/run`) makes
//! that a failure.

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::server::server_url;

/// A running PgBouncer for one test database.
pub struct PgBouncer {
    child: Child,
    dir: PathBuf,
    /// The test database through the transaction-mode pool.
    pub transaction_url: String,
    /// The test database through the session-mode pool.
    pub session_url: String,
}

/// Where the pooler's binary is, if installed.
fn binary() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend(["/usr/sbin", "/usr/local/sbin"].map(PathBuf::from));
    dirs.into_iter()
        .map(|d| d.join("pgbouncer"))
        .find(|p| p.is_file())
}

/// The server's host, port and user, from `DATABASE_URL`.
fn server_parts() -> (String, u16, String) {
    let url = server_url();
    let rest = url.split_once("://").map_or(url.as_str(), |(_, r)| r);
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    let (user, hostport) = match authority.rsplit_once('@') {
        Some((userinfo, hostport)) => (
            userinfo.split(':').next().unwrap_or("postgres").to_owned(),
            hostport,
        ),
        None => ("postgres".to_owned(), authority),
    };
    let (host, port) = match hostport.rsplit_once(':') {
        Some((host, port)) => (host.to_owned(), port.parse().expect("port in DATABASE_URL")),
        None => (hostport.to_owned(), 5432),
    };
    let host = if host.is_empty() {
        "127.0.0.1".to_owned()
    } else {
        host
    };
    (host, port, user)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

impl PgBouncer {
    /// Starts PgBouncer in front of database `db`, or returns `None` when it
    /// is not installed (see the module's documentation).
    pub fn start(db: &str) -> Option<PgBouncer> {
        let Some(binary) = binary() else {
            if std::env::var("PGFIFO_REQUIRE_PGBOUNCER").as_deref() == Ok("1") {
                panic!("pgbouncer is not installed (apt-get install -y pgbouncer)");
            }
            eprintln!("pgbouncer is not installed: skipping (apt-get install -y pgbouncer)");
            return None;
        };
        let (host, server_port, user) = server_parts();
        let dir = std::env::temp_dir().join(format!("pgfifo-pgbouncer-{db}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("pgbouncer dir");
        let root = is_root();
        // PgBouncer refuses to run as root: it switches to `postgres`, which
        // must be able to write its log there.
        if root {
            let _ = Command::new("chown").arg("postgres").arg(&dir).status();
        }
        let target = |mode: &str| {
            format!(
                "{db}_{mode} = host={host} port={server_port} dbname={db} pool_mode={mode}\n",
                mode = mode
            )
        };
        let port = free_port();
        let config = format!(
            "[databases]\n{tx}{session}\n[pgbouncer]\n\
             listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {users}\n\
             default_pool_size = 40\nmax_client_conn = 400\n\
             server_round_robin = 1\nignore_startup_parameters = extra_float_digits,options\n\
             logfile = {log}\n",
            tx = target("transaction"),
            session = target("session"),
            users = dir.join("users.txt").display(),
            log = dir.join("pgbouncer.log").display(),
        );
        std::fs::write(dir.join("users.txt"), format!("\"{user}\" \"\"\n")).expect("users");
        std::fs::write(dir.join("pgbouncer.ini"), config).expect("config");
        let mut command = Command::new(binary);
        if root {
            command.args(["-u", "postgres"]);
        }
        let mut child = command
            .arg(dir.join("pgbouncer.ini"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start pgbouncer");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                let mut err = String::new();
                if let Some(mut stderr) = child.stderr.take() {
                    let _ = stderr.read_to_string(&mut err);
                }
                panic!("pgbouncer exited ({status}): {err}{}", read_log(&dir));
            }
            assert!(Instant::now() < deadline, "pgbouncer did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        let url = |mode: &str| format!("postgres://{user}@127.0.0.1:{port}/{db}_{mode}");
        Some(PgBouncer {
            transaction_url: url("transaction"),
            session_url: url("session"),
            child,
            dir,
        })
    }

    /// PgBouncer's log so far.
    pub fn log(&self) -> String {
        read_log(&self.dir)
    }
}

fn read_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("pgbouncer.log")).unwrap_or_default()
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

//! Private PostgreSQL servers for the failover tests: a primary and a
//! streaming standby made with `pg_basebackup -R`, each on a free port of
//! 127.0.0.1, with trust authentication, in a temporary directory.
//!
//! Both keep commit timestamps (`track_commit_timestamp`), so that a test
//! can tell when a row committed, on either server.
//!
//! The tests kill (`kill -9` of the postmaster), freeze (SIGSTOP of every
//! process of the server) and promote them. A [`Node`] is stopped and its
//! files deleted when dropped, also when the test panics: a frozen server
//! is continued first. As with the fault suite's `PrivatePg`, when the
//! tests run as root every server command runs as the `postgres` OS user.
//!
//! `PG_BIN` overrides the directory of the server binaries (default
//! `/usr/lib/postgresql/15/bin`).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// One private server.
#[derive(Debug)]
pub struct Node {
    root: PathBuf,
    data: PathBuf,
    log: PathBuf,
    port: u16,
    as_postgres: bool,
    frozen: Vec<u32>,
}

impl Node {
    /// A new primary (initdb and start). It replicates asynchronously until
    /// told otherwise (`synchronous_standby_names`, once a standby runs).
    pub fn primary() -> Result<Node, String> {
        Node::initdb(
            "primary",
            "max_connections = 100\nshared_buffers = 32MB\nwal_level = replica\n\
             max_wal_senders = 5\nwal_keep_size = 256MB\n",
        )
    }

    /// A new server (initdb and start) with `settings` appended to its
    /// configuration; `role` goes into its directory's name.
    pub fn initdb(role: &str, settings: &str) -> Result<Node, String> {
        let node = Node::prepare(role)?;
        let mut initdb = node.command("initdb");
        initdb.arg("-D").arg(&node.data).args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-instructions",
        ]);
        run(&mut initdb)?;
        node.configure(settings)?;
        node.start()?;
        Ok(node)
    }

    /// A streaming standby of `primary` (`pg_basebackup -R`), started.
    pub fn standby_of(primary: &Node) -> Result<Node, String> {
        let node = Node::prepare("standby")?;
        let mut backup = node.command("pg_basebackup");
        backup
            .arg("-D")
            .arg(&node.data)
            .args(["-h", "127.0.0.1", "-U", "postgres", "-R", "-X", "stream"])
            .arg("-p")
            .arg(primary.port.to_string());
        run(&mut backup)?;
        node.configure("synchronous_standby_names = ''\n")?;
        node.start()?;
        Ok(node)
    }

    fn prepare(role: &str) -> Result<Node, String> {
        sweep_old_logs();
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let root = std::env::temp_dir().join(format!(
            "pgfifo-failover-{}-{}-{role}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).map_err(|e| format!("create {}: {e}", root.display()))?;
        let as_postgres = running_as_root();
        if as_postgres {
            run(Command::new("chown").arg("postgres:postgres").arg(&root))?;
        }
        Ok(Node {
            data: root.join("data"),
            log: root.join("server.log"),
            root,
            port: free_port()?,
            as_postgres,
            frozen: Vec::new(),
        })
    }

    /// Appends the port, socket and logging settings and `extra` to the
    /// configuration.
    fn configure(&self, extra: &str) -> Result<(), String> {
        let conf = format!(
            "\n# pgfifo failover tests\nport = {}\nlisten_addresses = '127.0.0.1'\n\
             unix_socket_directories = '{}'\nfsync = on\ntrack_commit_timestamp = on\n\
             log_line_prefix = '%m [%p] %a '\n{extra}",
            self.port,
            self.root.display()
        );
        use std::io::Write;
        let path = self.data.join("postgresql.conf");
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| format!("open {}: {e}", path.display()))?;
        file.write_all(conf.as_bytes())
            .map_err(|e| format!("write {}: {e}", path.display()))
    }

    /// `pg_ctl start`, waiting until it accepts connections.
    pub fn start(&self) -> Result<(), String> {
        let mut start = self.command("pg_ctl");
        start
            .arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(&self.log)
            .args(["-w", "-t", "60", "start"]);
        run(&mut start).map(drop)
    }

    /// The port (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port`, for a multi-host URL.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// A URL for database `db` on this server alone.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// The server's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The postmaster's process id, from `postmaster.pid`.
    pub fn postmaster_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.data.join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// The postmaster and every process it started.
    fn processes(&self) -> Vec<u32> {
        let Some(postmaster) = self.postmaster_pid() else {
            return Vec::new();
        };
        let mut pids = vec![postmaster];
        if let Ok(entries) = std::fs::read_dir("/proc") {
            for entry in entries.flatten() {
                let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                    continue;
                };
                let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                    continue;
                };
                // pid (comm) state ppid ...: the name may hold spaces.
                let ppid = stat
                    .rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                    .and_then(|p| p.parse::<u32>().ok());
                if ppid == Some(postmaster) {
                    pids.push(pid);
                }
            }
        }
        pids
    }

    /// `kill -9` of the postmaster: its children notice and exit, and every
    /// session ends as with a crash of the machine's database.
    pub fn kill_postmaster(&self) -> Result<(), String> {
        let pid = self.postmaster_pid().ok_or("no postmaster.pid")?;
        signal("KILL", &[pid])
    }

    /// SIGSTOP of every process of the server: it hangs, its sockets stay
    /// open and its kernel still answers TCP. [`Node::thaw`] (or the drop)
    /// continues them.
    pub fn freeze(&mut self) -> Result<(), String> {
        let pids = self.processes();
        signal("STOP", &pids)?;
        self.frozen = pids;
        Ok(())
    }

    /// SIGSTOP of the postmaster alone: it accepts TCP connections (the
    /// kernel does) and never answers them.
    pub fn freeze_postmaster(&mut self) -> Result<(), String> {
        let pid = self.postmaster_pid().ok_or("no postmaster.pid")?;
        signal("STOP", &[pid])?;
        self.frozen = vec![pid];
        Ok(())
    }

    /// Continues what [`freeze`](Self::freeze) stopped.
    pub fn thaw(&mut self) -> Result<(), String> {
        let pids = std::mem::take(&mut self.frozen);
        signal("CONT", &pids)
    }

    /// `pg_ctl promote`, waiting until the server leaves recovery. Returns
    /// when it did.
    pub fn promote(&self) -> Result<Instant, String> {
        let mut promote = self.command("pg_ctl");
        promote
            .arg("-D")
            .arg(&self.data)
            .args(["-w", "-t", "60", "promote"]);
        run(&mut promote)?;
        Ok(Instant::now())
    }

    /// `pg_ctl stop -m fast`: sessions are ended, and the WAL is sent to
    /// the standby before the server exits.
    pub fn stop_fast(&self) -> Result<(), String> {
        let mut stop = self.command("pg_ctl");
        stop.arg("-D")
            .arg(&self.data)
            .args(["-m", "fast", "-w", "-t", "60", "stop"]);
        run(&mut stop).map(drop)
    }

    fn stop_immediate(&self) {
        let mut stop = self.command("pg_ctl");
        stop.arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "-t", "30", "stop"]);
        let _ = stop.output();
    }

    fn command(&self, tool: &str) -> Command {
        let bin = PathBuf::from(
            std::env::var("PG_BIN").unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".to_owned()),
        );
        let mut cmd = if self.as_postgres {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(bin.join(tool));
            cmd
        } else {
            Command::new(bin.join(tool))
        };
        cmd.current_dir(&self.root);
        cmd
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.thaw();
        self.stop_immediate();
        // A killed postmaster's children exit by themselves; any left (a
        // frozen one) are killed.
        let _ = signal("KILL", &self.processes());
        if std::thread::panicking() {
            eprintln!("failover test: server log kept in {}", self.log.display());
            let _ = std::fs::remove_dir_all(&self.data);
        } else {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// Deletes what failed runs kept (their server logs; the data directories
/// go with the test) once a day old.
fn sweep_old_logs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > Duration::from_secs(86_400));
        if old
            && entry
                .file_name()
                .to_string_lossy()
                .starts_with("pgfifo-failover-")
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Sends `kill -SIG` to `pids`.
fn signal(sig: &str, pids: &[u32]) -> Result<(), String> {
    if pids.is_empty() {
        return Ok(());
    }
    let mut kill = Command::new("kill");
    kill.arg(format!("-{sig}"));
    kill.args(pids.iter().map(u32::to_string));
    run(&mut kill).map(drop)
}

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|rest| rest.split_whitespace().next().map(|uid| uid == "0"))
        })
        .unwrap_or(false)
}

/// A port on 127.0.0.1 that nothing listens on, from 7500 upwards (offset by
/// the process id; the fault suite takes 5433..7433).
fn free_port() -> Result<u16, String> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let offset = std::process::id() % 1000 + NEXT.fetch_add(7, Ordering::Relaxed);
    for i in 0..1000u32 {
        let port = 7500 + u16::try_from((offset + i) % 1000).expect("below 1000");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err("no free port in 7500..8500".to_owned())
}

fn run(cmd: &mut Command) -> Result<Output, String> {
    let out = cmd.output().map_err(|e| format!("run {cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "{cmd:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Waits until `check` holds, up to `limit`, looking every 20 ms.
pub async fn wait_until(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let began = Instant::now();
    while began.elapsed() < limit {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    check()
}

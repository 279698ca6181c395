//! A throwaway PostgreSQL server for the fault-injection suite.
//!
//! The suite restarts PostgreSQL and kills its connections, so it cannot use
//! the machine's shared server (other tests and benchmarks run against it). It
//! starts its own instance instead: `initdb` into a temporary directory, a free
//! port on 127.0.0.1, trust authentication, `fsync=on`,
//! `track_commit_timestamp=on` (the suite reads when transactions
//! committed), the unix socket in the same directory. PostgreSQL refuses to run as root, so when the suite runs as
//! root every server command runs as the `postgres` OS user (`runuser -u
//! postgres --`), in a directory owned by that user.
//!
//! [`PrivatePg`] stops the server (immediate mode) and deletes its data when
//! dropped, also when the test panics. Directories left by a test process that
//! was killed outright are cleaned up by the next [`PrivatePg::start`].
//!
//! `PG_BIN` overrides the directory of the server binaries (default
//! `/usr/lib/postgresql/15/bin`).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The name prefix of the suite's temporary directories in the temp dir.
const PREFIX: &str = "pgfifo-faults-";

/// How `restart` stops the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMode {
    /// `pg_ctl stop -m fast`: sessions are terminated, their transactions
    /// roll back, a shutdown checkpoint is written.
    Fast,
    /// `pg_ctl stop -m immediate`: the server is killed; the start runs crash
    /// recovery.
    Immediate,
}

impl StopMode {
    fn as_arg(self) -> &'static str {
        match self {
            StopMode::Fast => "fast",
            StopMode::Immediate => "immediate",
        }
    }
}

/// A private PostgreSQL instance, stopped and deleted on drop.
#[derive(Debug)]
pub struct PrivatePg {
    root: PathBuf,
    pg_dir: PathBuf,
    data: PathBuf,
    log: PathBuf,
    bin: PathBuf,
    port: u16,
    as_postgres: bool,
    running: bool,
    keep_files: bool,
}

impl PrivatePg {
    /// Creates and starts a new instance in a fresh directory under the
    /// system temp dir.
    pub fn start() -> Result<PrivatePg, String> {
        sweep_stale();
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let root = std::env::temp_dir().join(format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&root);
        let pg_dir = root.join("pg");
        std::fs::create_dir_all(&pg_dir)
            .map_err(|e| format!("create {}: {e}", pg_dir.display()))?;
        let bin = PathBuf::from(
            std::env::var("PG_BIN").unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".to_owned()),
        );
        let as_postgres = running_as_root();
        if as_postgres {
            run(Command::new("chown").arg("postgres:postgres").arg(&pg_dir))?;
        }
        let port = free_port()?;
        let mut pg = PrivatePg {
            data: pg_dir.join("data"),
            log: pg_dir.join("server.log"),
            root,
            pg_dir,
            bin,
            port,
            as_postgres,
            running: false,
            keep_files: false,
        };
        let mut initdb = pg.command("initdb");
        initdb.arg("-D").arg(&pg.data).args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-instructions",
        ]);
        run(&mut initdb)?;
        let conf = format!(
            "\n# pgfifo fault-injection suite\n\
             port = {port}\n\
             listen_addresses = '127.0.0.1'\n\
             unix_socket_directories = '{}'\n\
             fsync = on\n\
             max_connections = 200\n\
             shared_buffers = 32MB\n\
             track_commit_timestamp = on\n\
             log_line_prefix = '%m [%p] %a '\n",
            pg.pg_dir.display()
        );
        append(&pg.data.join("postgresql.conf"), &conf)?;
        pg.start_server()?;
        Ok(pg)
    }

    /// The port the server listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A connection URL for database `db`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// The directory holding everything of this instance (and free for the
    /// caller's own files: it is deleted with the instance).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The server's log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The server's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Keeps the directory (minus the data directory) when dropped, for
    /// inspection.
    pub fn keep_files(&mut self) {
        self.keep_files = true;
    }

    /// Starts the (stopped) server and waits until it accepts connections.
    pub fn start_server(&mut self) -> Result<(), String> {
        let mut start = self.command("pg_ctl");
        start
            .arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(&self.log)
            .args(["-w", "-t", "60", "start"]);
        run(&mut start)?;
        self.running = true;
        Ok(())
    }

    /// Stops the server.
    pub fn stop_server(&mut self, mode: StopMode) -> Result<(), String> {
        let mut stop = self.command("pg_ctl");
        stop.arg("-D")
            .arg(&self.data)
            .args(["-m", mode.as_arg(), "-w", "-t", "60", "stop"]);
        run(&mut stop)?;
        self.running = false;
        Ok(())
    }

    /// A full restart: stop (every session ends) and start again. Returns how
    /// long the server was unavailable (stop plus start).
    pub fn restart(&mut self, mode: StopMode) -> Result<Duration, String> {
        let began = Instant::now();
        self.stop_server(mode)?;
        self.start_server()?;
        Ok(began.elapsed())
    }

    fn command(&self, tool: &str) -> Command {
        let path = self.bin.join(tool);
        let mut cmd = if self.as_postgres {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(path);
            cmd
        } else {
            Command::new(path)
        };
        // The postgres user may not be allowed into the caller's directory.
        cmd.current_dir(&self.pg_dir);
        cmd
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        if self.running {
            let _ = self.stop_server(StopMode::Immediate);
        }
        let _ = std::fs::remove_dir_all(&self.data);
        if self.keep_files || std::thread::panicking() {
            eprintln!(
                "private PostgreSQL: files kept in {} (server log: {})",
                self.root.display(),
                self.log.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// Whether this process runs as root (uid 0), from `/proc/self/status`.
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

/// A port on 127.0.0.1 that nothing listens on, from 5433 upwards (offset by
/// the process id so that parallel runs try different ports first).
fn free_port() -> Result<u16, String> {
    let offset = std::process::id() % 2000;
    for i in 0..2000u32 {
        let port = 5433 + u16::try_from((offset + i) % 2000).expect("below 2000");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err("no free port in 5433..7433".to_owned())
}

fn append(path: &Path, text: &str) -> Result<(), String> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(|e| format!("open {}: {e}", path.display()))?;
    file.write_all(text.as_bytes())
        .map_err(|e| format!("write {}: {e}", path.display()))
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

/// Stops and deletes instances left by test processes that no longer exist
/// (killed before their guard could run).
fn sweep_stale() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let root = entry.path();
        let data = root.join("pg").join("data");
        if data.join("postmaster.pid").exists() {
            let bin = PathBuf::from(
                std::env::var("PG_BIN").unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".to_owned()),
            );
            let mut cmd = if running_as_root() {
                let mut cmd = Command::new("runuser");
                cmd.args(["-u", "postgres", "--"]).arg(bin.join("pg_ctl"));
                cmd
            } else {
                Command::new(bin.join("pg_ctl"))
            };
            cmd.current_dir(root.join("pg")).arg("-D").arg(&data).args([
                "-m",
                "immediate",
                "-w",
                "stop",
            ]);
            let _ = cmd.output();
        }
        let _ = std::fs::remove_dir_all(&data);
        // Keep the logs of a failed run for a day, then remove them too.
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > Duration::from_secs(86_400));
        if old {
            let _ = std::fs::remove_dir_all(&root);
        }
    }
}

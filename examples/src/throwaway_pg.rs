//! A PostgreSQL server for the demo when none answers at `DATABASE_URL`.
//!
//! A newcomer may run the demo where PostgreSQL is installed but not running,
//! or where `DATABASE_URL` points nowhere. Rather than a connection error,
//! the demo then starts a private server of its own: `initdb` into a
//! temporary directory, trust authentication, a free port on 127.0.0.1. It
//! is stopped and its directory deleted when the [`ThrowawayPg`] is dropped.
//!
//! The server binaries are looked up in `PG_BIN`, then in `pg_config
//! --bindir`, then in the newest `/usr/lib/postgresql/*/bin`. PostgreSQL
//! refuses to run as root, so as root the server runs as the `postgres` OS
//! user (`runuser`). Every step has a time limit, so the demo never hangs.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;

/// How long `pg_ctl` may take to start or stop the server, in seconds.
const PG_CTL_SECONDS: &str = "30";

/// A private PostgreSQL server, stopped and deleted on drop.
#[derive(Debug)]
pub struct ThrowawayPg {
    dir: PathBuf,
    bin: PathBuf,
    as_postgres: bool,
    port: u16,
}

impl ThrowawayPg {
    /// Starts a server with the binaries in `bin` (a directory holding
    /// `initdb` and `pg_ctl`).
    pub fn start(bin: PathBuf) -> Result<ThrowawayPg, String> {
        let dir = std::env::temp_dir().join(format!("pgfifo-demo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let as_postgres = is_root();
        if as_postgres {
            checked(Command::new("chown").arg("postgres:postgres").arg(&dir))?;
        }
        let port = free_port().ok_or("no free port on 127.0.0.1")?;
        // From here on, dropping the guard cleans up whatever was made.
        let pg = ThrowawayPg {
            dir,
            bin,
            as_postgres,
            port,
        };
        checked(pg.tool("initdb").arg("-D").arg(pg.data()).args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-instructions",
        ]))?;
        let options = format!(
            "-c port={port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} \
             -c fsync=off",
            pg.dir.display()
        );
        checked(
            pg.tool("pg_ctl")
                .arg("-D")
                .arg(pg.data())
                .arg("-l")
                .arg(pg.dir.join("server.log"))
                .args(["-o", &options, "-w", "-t", PG_CTL_SECONDS, "start"]),
        )?;
        Ok(pg)
    }

    /// The URL of the server's `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Where its files are (removed on drop).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// `tool` from the server binaries, as the `postgres` user when root.
    fn tool(&self, tool: &str) -> Command {
        let path = self.bin.join(tool);
        let mut cmd = if self.as_postgres {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(path);
            cmd
        } else {
            Command::new(path)
        };
        // The postgres user may not be allowed into the caller's directory.
        cmd.current_dir(&self.dir);
        cmd
    }
}

impl Drop for ThrowawayPg {
    fn drop(&mut self) {
        if self.data().join("postmaster.pid").exists() {
            let _ = checked(self.tool("pg_ctl").arg("-D").arg(self.data()).args([
                "-m",
                "immediate",
                "-w",
                "-t",
                PG_CTL_SECONDS,
                "stop",
            ]));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The directory of the PostgreSQL server binaries on this machine, if any:
/// `PG_BIN`, else `pg_config --bindir`, else the newest
/// `/usr/lib/postgresql/<version>/bin`. Only a directory holding `initdb`
/// and `pg_ctl` counts.
pub fn find_server_binaries() -> Option<PathBuf> {
    let usable = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    if let Some(dir) = std::env::var_os("PG_BIN") {
        // An explicit choice: no other place is tried.
        let dir = PathBuf::from(dir);
        return usable(&dir).then_some(dir);
    }
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
    if let Some(dir) = from_pg_config.filter(|dir| usable(dir)) {
        return Some(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, dir)| usable(dir))
        .collect();
    versions.sort();
    versions.pop().map(|(_, dir)| dir)
}

/// Whether this process runs as root, from `/proc/self/status`.
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let uids = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
            Some(uids.split_whitespace().next()? == "0")
        })
        .unwrap_or(false)
}

/// A port on 127.0.0.1 that nothing listens on, chosen by the system.
fn free_port() -> Option<u16> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).ok()?;
    listener.local_addr().ok().map(|addr| addr.port())
}

/// Runs `cmd`; an error carries its output when it fails.
fn checked(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("run {cmd:?}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{cmd:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

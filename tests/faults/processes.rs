//! The worker processes: starting, killing, stopping and supervising them.

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pgfifo_tests::faults::runs::{self, Line};
use pgfifo_tests::records::now_ns;

use crate::jobs::{APP_PREFIX, FREEZER_GRACE, HOT_GROUPS, LONG_LEASE, WORKER_GRACE};

// --- Worker processes -------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Serves `faults`; killed at random and replaced.
    Worker,
    /// Serves `freeze` with one slot; frozen.
    Freezer,
    /// Serves `freeze` while the freezer is frozen.
    Rescuer,
    /// Serves `prefetch` with one slot (and the runner's prefetch lane).
    Prefetcher,
    /// Serves `hot` (`hot.rs`); killed now and then while it works through
    /// a burst, and replaced.
    Hot,
}

pub(crate) struct Proc {
    pub(crate) role: Role,
    pub(crate) app: String,
    pub(crate) pid: u32,
    child: Child,
    /// Held open: with `EXIT_WITH_STDIN=1` the worker exits when it closes.
    _stdin: ChildStdin,
    pub(crate) stdout: Arc<Mutex<Vec<String>>>,
    pub(crate) records: PathBuf,
    pub(crate) stderr: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cause {
    Killed,
    Poison,
    Stopped,
    Unexpected(String),
}

#[derive(Debug, Clone)]
pub(crate) struct Death {
    pub(crate) pid: u32,
    pub(crate) app: String,
    pub(crate) role: Role,
    pub(crate) ns: i64,
    pub(crate) cause: Cause,
}

/// Every worker process of the run. Dropping it SIGKILLs those still alive
/// (also frozen ones), so no worker outlives a failed test.
pub(crate) struct Fleet {
    dir: PathBuf,
    url: String,
    pub(crate) alive: Vec<Proc>,
    pub(crate) deaths: Vec<Death>,
    pub(crate) records: Vec<(u32, PathBuf)>,
    stderrs: Vec<(String, PathBuf)>,
    counter: usize,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for p in &mut self.alive {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

impl Fleet {
    pub(crate) fn new(dir: PathBuf, url: String) -> Fleet {
        Fleet {
            dir,
            url,
            alive: Vec::new(),
            deaths: Vec::new(),
            records: Vec::new(),
            stderrs: Vec::new(),
            counter: 0,
        }
    }

    /// Starts a worker and waits until its runner runs. Returns its pid.
    pub(crate) async fn spawn(&mut self, role: Role, concurrency: usize) -> u32 {
        self.counter += 1;
        let (kind, queues, grace) = match role {
            Role::Worker => ("w", "faults", WORKER_GRACE),
            Role::Freezer => ("freezer", "freeze,freeze_long", FREEZER_GRACE),
            Role::Rescuer => ("rescuer", "freeze,freeze_long", FREEZER_GRACE),
            Role::Prefetcher => ("pf", "prefetch", WORKER_GRACE),
            Role::Hot => ("hot", "hot", WORKER_GRACE),
        };
        let app = format!("{APP_PREFIX}{kind}{}", self.counter);
        let records = self.dir.join(format!("{app}.records"));
        let stderr = self.dir.join(format!("{app}.stderr"));
        let err_file = std::fs::File::create(&stderr).expect("create a worker's stderr file");
        let mut child = Command::new(env!("CARGO_BIN_EXE_fault-worker"))
            .env("DATABASE_URL", &self.url)
            .env("APP_NAME", &app)
            .env("RECORDS_FILE", &records)
            .env("QUEUES", queues)
            .env("CONCURRENCY", concurrency.to_string())
            .env("IDLE_GRACE_MS", grace.as_millis().to_string())
            // The freeze scenarios' processes: a short lease for long jobs.
            .envs(
                matches!(role, Role::Freezer | Role::Rescuer)
                    .then(|| ("LONG_LEASE_MS", LONG_LEASE.as_millis().to_string())),
            )
            .env("EXIT_WITH_STDIN", "1")
            .envs(std::env::var("FAULTS_WORKER_POOL").map(|n| ("POOL_SIZE", n)))
            // Planned panics print one line, not a backtrace each.
            .env("RUST_BACKTRACE", "0")
            .current_dir(&self.dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(err_file))
            .spawn()
            .expect("spawn fault-worker");
        let pid = child.id();
        let stdin = child.stdin.take().expect("piped stdin");
        let out = child.stdout.take().expect("piped stdout");
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let sink = stdout.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                sink.lock().unwrap().push(line);
            }
        });
        self.records.push((pid, records.clone()));
        self.stderrs.push((app.clone(), stderr.clone()));
        let mut proc = Proc {
            role,
            app,
            pid,
            child,
            _stdin: stdin,
            stdout,
            records,
            stderr,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if proc
                .stdout
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.starts_with("ready"))
            {
                break;
            }
            if let Ok(Some(status)) = proc.child.try_wait() {
                panic!(
                    "{} exited before it was ready ({status}): {}",
                    proc.app,
                    tail(&proc.stderr, 20)
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} not ready after 60 s: {}",
                proc.app,
                tail(&proc.stderr, 20)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.alive.push(proc);
        pid
    }

    pub(crate) fn get(&self, pid: u32) -> Option<&Proc> {
        self.alive.iter().find(|p| p.pid == pid)
    }

    pub(crate) fn pids(&self, role: Role) -> Vec<u32> {
        self.alive
            .iter()
            .filter(|p| p.role == role)
            .map(|p| p.pid)
            .collect()
    }

    /// SIGKILLs a process now. Returns when it was gone: once reaped, so
    /// that no run of it starts later (a time taken before the signal can
    /// precede a handler's start, which the checks would then not see cut
    /// off: hot handlers start every millisecond).
    pub(crate) fn kill(&mut self, pid: u32) -> i64 {
        let i = self.alive.iter().position(|p| p.pid == pid).expect("alive");
        let mut p = self.alive.remove(i);
        p.child.kill().expect("SIGKILL a worker");
        let _ = p.child.wait();
        let ns = now_ns();
        self.deaths.push(Death {
            pid,
            app: p.app,
            role: p.role,
            ns,
            cause: Cause::Killed,
        });
        ns
    }

    /// Notices processes that died on their own, classifies them and starts
    /// replacements for workers (and for the freezer, should it die).
    pub(crate) async fn supervise(&mut self, concurrency: usize) {
        let mut i = 0;
        while i < self.alive.len() {
            let status = match self.alive[i].child.try_wait() {
                Ok(Some(status)) => status,
                _ => {
                    i += 1;
                    continue;
                }
            };
            let p = self.alive.remove(i);
            let abort_ns = (status.signal() == Some(6))
                .then(|| abort_line(&p.records, p.pid))
                .flatten();
            let (ns, cause) = match abort_ns {
                Some(ns) => (ns, Cause::Poison),
                None => {
                    let what = format!("{status}; stderr: {}", tail(&p.stderr, 15));
                    eprintln!(
                        "faults: {} (pid {}) died unexpectedly: {what}",
                        p.app, p.pid
                    );
                    (now_ns(), Cause::Unexpected(what))
                }
            };
            self.deaths.push(Death {
                pid: p.pid,
                app: p.app.clone(),
                role: p.role,
                ns,
                cause,
            });
            match p.role {
                Role::Worker => {
                    self.spawn(Role::Worker, concurrency).await;
                }
                Role::Freezer => {
                    self.spawn(Role::Freezer, 1).await;
                }
                Role::Hot => {
                    self.spawn(Role::Hot, HOT_GROUPS as usize).await;
                }
                Role::Rescuer | Role::Prefetcher => {}
            }
        }
    }

    /// SIGTERMs a process and waits for its graceful exit.
    pub(crate) async fn stop(&mut self, pid: u32) {
        signal(pid, "TERM");
        let i = self.alive.iter().position(|p| p.pid == pid).expect("alive");
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Ok(Some(status)) = self.alive[i].child.try_wait() {
                break Some(status);
            }
            if Instant::now() > deadline {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let mut p = self.alive.remove(i);
        let cause = match status {
            Some(s) if s.success() => Cause::Stopped,
            Some(s) => Cause::Unexpected(format!(
                "exit {s} after SIGTERM; stderr: {}",
                tail(&p.stderr, 15)
            )),
            None => {
                let _ = p.child.kill();
                let _ = p.child.wait();
                Cause::Unexpected("still running 30 s after SIGTERM".to_owned())
            }
        };
        self.deaths.push(Death {
            pid,
            app: p.app,
            role: p.role,
            ns: now_ns(),
            cause,
        });
    }

    pub(crate) fn unexpected(&self) -> Vec<&Death> {
        self.deaths
            .iter()
            .filter(|d| matches!(d.cause, Cause::Unexpected(_)))
            .collect()
    }
}

/// The time of the poison `A` line process `pid` wrote, if any.
fn abort_line(records: &Path, pid: u32) -> Option<i64> {
    let text = std::fs::read_to_string(records).ok()?;
    runs::parse_all(&text).0.into_iter().find_map(|l| match l {
        Line::Abort { pid: p, ns, .. } if p == pid => Some(ns),
        _ => None,
    })
}

pub(crate) fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{sig} {pid}: {status}");
}

/// The last `n` lines of a file.
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Runs of `records` started after `since_ns` that have not ended.
pub(crate) fn in_flight_since(records: &Path, since_ns: i64) -> usize {
    let text = std::fs::read_to_string(records).unwrap_or_default();
    let (lines, _) = runs::parse_all(&text);
    let recent: Vec<Line> = lines
        .into_iter()
        .filter(|l| !matches!(l, Line::Start { ns, .. } if *ns < since_ns))
        .collect();
    runs::in_flight(&recent)
}

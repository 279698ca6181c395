//! A `fifo-worker` process that appends the id of every success its runner
//! reports to a file of acknowledgements, for the tests that kill servers
//! or workers under it (`tests/failover/processes.rs`, `tests/citus/`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

/// One worker process; killed if still running when dropped.
pub struct AckedWorker {
    /// The process.
    pub child: Child,
    /// Held open: with `EXIT_WITH_STDIN=1` the worker exits when it closes.
    _stdin: ChildStdin,
    /// The file of the successes it reported, one job id a line.
    pub acks: PathBuf,
}

impl Drop for AckedWorker {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl AckedWorker {
    /// Starts `bin` (the test's `env!("CARGO_BIN_EXE_fifo-worker")`) on
    /// `url` with four lanes and the extra `env`; its records, acks and log
    /// go to `dir` under `name`. Returns once it printed `ready`.
    pub fn start(bin: &str, name: &str, url: &str, dir: &Path, env: &[(&str, &str)]) -> Self {
        let acks = dir.join(format!("acks-{name}"));
        let mut child = Command::new(bin)
            .env("DATABASE_URL", url)
            .env("RECORDS_FILE", dir.join(format!("runs-{name}")))
            .env("ACKS_FILE", &acks)
            .env("CONCURRENCY", "4")
            .env("EXIT_WITH_STDIN", "1")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // Its log: kept with the records when the test fails.
            .stderr(std::fs::File::create(dir.join(format!("log-{name}"))).expect("log file"))
            .spawn()
            .expect("spawn fifo-worker");
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        // Keeps reading after "ready" so the worker never meets a closed pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.starts_with("ready") {
                    let _ = tx.send(());
                }
            }
        });
        rx.recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("worker {name} not ready after 60 s"));
        AckedWorker {
            child,
            _stdin: stdin,
            acks,
        }
    }
}

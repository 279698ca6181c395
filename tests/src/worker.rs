//! What the worker binaries (`fifo-worker`, `fault-worker`) share: logging,
//! environment, the records file, stdout lines, and running a runner until
//! SIGTERM/SIGINT.

use std::fs::File;
use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use pgfifo::{Pool, RunnerConfig};

/// Logs to stderr, filtered by `PGFIFO_TEST_LOG` (default `warn`); `ansi`
/// turns colours on or off.
pub fn init_logging(ansi: bool) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PGFIFO_TEST_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .try_init();
}

/// The environment variable `name`, which must be set.
pub fn var(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|e| format!("{name}: {e}"))
}

/// The environment variable `name` parsed, or `default` when it is not set.
pub fn number<T>(name: &str, default: T) -> Result<T, String>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    match std::env::var(name) {
        Ok(v) => v.parse().map_err(|e| format!("{name}={v:?}: {e}")),
        Err(_) => Ok(default),
    }
}

/// With `EXIT_WITH_STDIN=1`, exits the process (as `who`) as soon as stdin
/// closes, so that a worker never outlives a parent that died without
/// cleaning up. The running jobs' transactions then roll back on the server.
pub fn exit_with_stdin_if_asked(who: &'static str) {
    if std::env::var("EXIT_WITH_STDIN").is_ok_and(|v| v == "1") {
        std::thread::spawn(move || exit_when_stdin_closes(who));
    }
}

fn exit_when_stdin_closes(who: &str) {
    let mut buf = [0u8; 64];
    let mut stdin = std::io::stdin().lock();
    loop {
        match stdin.read(&mut buf) {
            Ok(0) | Err(_) => {
                eprintln!("{who} {}: stdin closed: exiting", std::process::id());
                std::process::exit(3);
            }
            Ok(_) => {}
        }
    }
}

/// Opens the records file at `path` for appending (creating it).
pub fn open_records(path: &str) -> Result<File, String> {
    File::options()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("open {path}: {e}"))
}

/// Connects a pool of `size` connections to `url`.
pub async fn connect(url: &str, size: u32) -> Result<Pool, String> {
    pgfifo::connect(url, size)
        .await
        .map_err(|e| format!("connect: {e}"))
}

/// The runner settings both workers use: `queues`, `concurrency` and a
/// 100 ms poll interval.
pub fn base_config<I, S>(queues: I, concurrency: usize) -> RunnerConfig
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    RunnerConfig::default()
        .queues(queues)
        .concurrency(concurrency)
        .poll_interval(Duration::from_millis(100))
}

/// Starts a runner, prints `ready pid=<pid>`, and drains and stops it on
/// SIGTERM or SIGINT.
pub async fn run_until_signal(pool: Pool, config: RunnerConfig) -> Result<(), String> {
    let runner = pgfifo::runner::start(pool, config)
        .await
        .map_err(|e| format!("start: {e}"))?;
    say(&format!("ready pid={}", std::process::id()));
    runner
        .shutdown_on_signal()
        .await
        .map_err(|e| format!("shutdown: {e}"))
}

/// The exit code of a worker's run; on an error, says so on stderr as `who`.
pub fn exit_code(who: &str, result: Result<(), String>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("{who} {}: {message}", std::process::id());
            ExitCode::FAILURE
        }
    }
}

/// Prints a line on stdout and flushes it (stdout is a pipe: block-buffered).
pub fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

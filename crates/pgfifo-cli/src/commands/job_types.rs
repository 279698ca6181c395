//! `pgfifo job-types`: the job types registered in the running binary.

use serde::Serialize;

use crate::error::CliResult;
use crate::output::{Output, Table};

/// The long help of `pgfifo job-types`.
pub const ABOUT: &str = "The job types registered in this binary: kind, queue, default \
    attempts, priority, timeout and backoff, long mode, and with --json the JSON Schema of \
    each payload (for types that derive schemars::JsonSchema, with pgfifo's `schema` feature). \
    What a producer in another language needs to call pgfifo.add_job (docs/enqueue-from-sql.md).\n\n\
    Job types live in the application's code: the stand-alone `pgfifo` binary has none. Build \
    the tool into a binary of the application (`fn main() -> ExitCode { pgfifo_cli::main() }`, \
    with the crate of the job types linked) and run `job-types` there. Needs no database.";

/// The document `--json` prints.
#[derive(Debug, Serialize)]
struct JobTypes {
    job_types: Vec<pgfifo::JobType>,
}

/// Prints the registered job types (a note on stderr when there are none).
pub fn list(out: Output) -> CliResult {
    let job_types = pgfifo::job_types()?;
    if job_types.is_empty() {
        eprintln!(
            "note: no job types are registered in this binary; job types live in your \
             application: run job-types from a binary of it that calls pgfifo_cli::main() \
             (see docs/enqueue-from-sql.md)"
        );
    }
    out.emit(&JobTypes { job_types }, |doc| {
        let mut table = Table::new(&[
            "KIND", "QUEUE", "ATTEMPTS", "PRIORITY", "TIMEOUT", "BACKOFF", "LONG", "SCHEMA",
        ]);
        for t in &doc.job_types {
            table.row(vec![
                t.kind.clone(),
                t.queue.clone(),
                t.max_attempts.to_string(),
                t.priority.to_string(),
                t.timeout_ms
                    .map_or_else(|| "default".to_owned(), |ms| format!("{ms}ms")),
                format!("{}ms", t.backoff_ms),
                if t.long { "yes" } else { "no" }.to_owned(),
                if t.payload_schema.is_some() {
                    "yes (--json)"
                } else {
                    "no"
                }
                .to_owned(),
            ]);
        }
        if table.is_empty() {
            String::new()
        } else {
            table.render()
        }
    })
}

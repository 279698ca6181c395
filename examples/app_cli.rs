//! An application's own `pgfifo` tool: the operator's commands of the
//! `pgfifo` binary, in a binary that also links the application's job types,
//! so that `job-types` lists them with their payloads' JSON Schemas.
//!
//! ```sh
//! cargo run -q -p pgfifo-examples --bin pgfifo-app -- job-types --json
//! ```
//!
//! In an application this is its `src/bin/pgfifo.rs` (docs/enqueue-from-sql.md).

// Links the crate that defines the job types (`#[derive(Job)]` registers
// them when the crate is linked; nothing else here names it).
extern crate pgfifo_examples;

fn main() -> std::process::ExitCode {
    pgfifo_cli::main()
}

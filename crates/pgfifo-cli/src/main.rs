//! `pgfifo`: the operator's command-line tool (see the library, `pgfifo_cli`).

fn main() -> std::process::ExitCode {
    pgfifo_cli::main()
}

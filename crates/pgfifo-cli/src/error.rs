//! How a command fails, and the exit code each failure gets.

use std::fmt;
use std::process::ExitCode;

/// Exit code of an operational failure: the command was well formed but
/// could not do its work (database unreachable, job not found, job running…).
pub const EXIT_FAILURE: u8 = 1;

/// Exit code of a usage error: the command line itself is wrong (clap's own
/// errors use it too).
pub const EXIT_USAGE: u8 = 2;

/// A command's failure: a message for stderr and an exit code.
#[derive(Debug)]
pub struct CliError {
    /// What went wrong, for people.
    pub message: String,
    /// The process's exit code ([`EXIT_FAILURE`] or [`EXIT_USAGE`]).
    pub code: u8,
}

impl CliError {
    /// An operational failure (exit code 1).
    pub fn failure(message: impl Into<String>) -> Self {
        CliError {
            message: message.into(),
            code: EXIT_FAILURE,
        }
    }

    /// A usage error found after parsing (exit code 2).
    pub fn usage(message: impl Into<String>) -> Self {
        CliError {
            message: message.into(),
            code: EXIT_USAGE,
        }
    }

    /// The exit code to end the process with.
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(self.code)
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<pgfifo::Error> for CliError {
    /// Names and arguments the library rejects are usage errors; everything
    /// else (the database, a job's state) is an operational failure.
    fn from(err: pgfifo::Error) -> Self {
        use pgfifo::Error;
        match err {
            Error::InvalidQueue { .. } | Error::InvalidGroup { .. } | Error::InvalidArgument(_) => {
                CliError::usage(err.to_string())
            }
            other => CliError::failure(other.to_string()),
        }
    }
}

/// What every command returns.
pub type CliResult<T = ()> = Result<T, CliError>;

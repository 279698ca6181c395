//! Telling database errors apart. By their kind (diesel's
//! [`DatabaseErrorKind`], from the SQLSTATE) and, for pgfifo's own errors,
//! by the constraint name its functions raise them with, since diesel's
//! error information keeps that field but not the SQLSTATE itself. Never by
//! message text, which a server version or `lc_messages` may change.

use diesel::result::{DatabaseErrorKind, Error};

/// A rule of pgfifo's that a function refused to break; the constraint name
/// it raises the error with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// `pgfifo_read_committed` (SQLSTATE 25000): enqueue and the operator
    /// functions need READ COMMITTED. The error's detail is the isolation
    /// level found.
    ReadCommitted,
    /// `pgfifo_job_transaction` (25P01): pick and complete run only in a job
    /// transaction (a handler that sent COMMIT ended it).
    JobTransaction,
    /// `pgfifo_group_busy` (55P03): the group's head is running.
    GroupBusy,
    /// `pgfifo_unique_key_busy` (55P03): a unique key kept changing hands
    /// while an enqueue looked for its holder.
    UniqueKeyBusy,
    /// `pgfifo_batch_missing` (P0002): no batch has the id in the error's
    /// detail.
    BatchMissing,
    /// `pgfifo_batch_closed` (55000): the batch in the error's detail is
    /// closed.
    BatchClosed,
    /// `pgfifo_dependency_missing` (23503): a dependency of an enqueued job
    /// does not exist; the error's detail names it (`job 17`, `batch 5`).
    DependencyMissing,
}

impl Refusal {
    const ALL: [(Refusal, &'static str); 7] = [
        (Refusal::ReadCommitted, "pgfifo_read_committed"),
        (Refusal::JobTransaction, "pgfifo_job_transaction"),
        (Refusal::GroupBusy, "pgfifo_group_busy"),
        (Refusal::UniqueKeyBusy, "pgfifo_unique_key_busy"),
        (Refusal::BatchMissing, "pgfifo_batch_missing"),
        (Refusal::BatchClosed, "pgfifo_batch_closed"),
        (Refusal::DependencyMissing, "pgfifo_dependency_missing"),
    ];
}

/// The pgfifo rule `err` reports, if it is one of pgfifo's own errors.
pub(crate) fn refusal(err: &Error) -> Option<Refusal> {
    let Error::DatabaseError(_, info) = err else {
        return None;
    };
    let name = info.constraint_name()?;
    Refusal::ALL
        .iter()
        .find(|(_, constraint)| *constraint == name)
        .map(|(refusal, _)| *refusal)
}

/// The detail of a database error (pgfifo's errors put a value there).
pub(crate) fn detail(err: &Error) -> Option<&str> {
    match err {
        Error::DatabaseError(_, info) => info.details(),
        _ => None,
    }
}

/// Whether `err` means the connection is gone or unusable, as opposed to an
/// SQL error on a working connection: errors that are not the server's
/// (diesel-async reports those as `UnableToSendCommand`), a closed
/// connection, and a transaction manager diesel considers broken.
pub(crate) fn is_connection_error(err: &Error) -> bool {
    match err {
        Error::DatabaseError(kind, _) => matches!(
            kind,
            DatabaseErrorKind::ClosedConnection | DatabaseErrorKind::UnableToSendCommand
        ),
        Error::BrokenTransactionManager => true,
        _ => false,
    }
}

/// The error of a round trip that got no answer within `deadline`: a
/// connection error ([`is_connection_error`]), so that whoever gets it
/// drops the connection.
pub(crate) fn timed_out(deadline: std::time::Duration) -> Error {
    Error::DatabaseError(
        DatabaseErrorKind::UnableToSendCommand,
        Box::new(format!(
            "the database server did not answer within {deadline:?}"
        )),
    )
}

/// Whether `err` says that the server takes no writes: SQLSTATE 25006
/// (read_only_sql_transaction), which diesel keeps as
/// [`DatabaseErrorKind::ReadOnlyTransaction`]. A server in recovery (a
/// standby, or a primary demoted after a failover) answers every write so.
pub(crate) fn is_read_only(err: &Error) -> bool {
    matches!(
        err,
        Error::DatabaseError(DatabaseErrorKind::ReadOnlyTransaction, _)
    )
}

/// Whether the connection that gave `err` must be replaced rather than used
/// again: it is gone or unusable ([`is_connection_error`]; a server that
/// ends a session with SQLSTATE 57P01..57P03 closes it, which is how those
/// show), or its server takes no writes ([`is_read_only`]), and a new
/// connection from a multi-host URL reaches the writable one.
pub(crate) fn must_replace(err: &Error) -> bool {
    is_connection_error(err) || is_read_only(err)
}

/// `err` with its causes: tokio-postgres's own message names only the kind
/// of error ("db error", "error connecting to server"); the server's
/// message or the operating system's reason is its source.
pub(crate) fn with_causes(err: &tokio_postgres::Error) -> String {
    let mut text = err.to_string();
    let mut cause = std::error::Error::source(err);
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Info(Option<&'static str>);

    impl diesel::result::DatabaseErrorInformation for Info {
        fn message(&self) -> &str {
            "the head of group g in queue q is running"
        }
        fn details(&self) -> Option<&str> {
            None
        }
        fn hint(&self) -> Option<&str> {
            None
        }
        fn table_name(&self) -> Option<&str> {
            None
        }
        fn column_name(&self) -> Option<&str> {
            None
        }
        fn constraint_name(&self) -> Option<&str> {
            self.0
        }
        fn statement_position(&self) -> Option<i32> {
            None
        }
    }

    fn db_error(kind: DatabaseErrorKind, constraint: Option<&'static str>) -> Error {
        Error::DatabaseError(kind, Box::new(Info(constraint)))
    }

    #[test]
    fn refusals_are_told_by_constraint_name_not_message() {
        let busy = db_error(DatabaseErrorKind::Unknown, Some("pgfifo_group_busy"));
        assert_eq!(refusal(&busy), Some(Refusal::GroupBusy));
        // The same message without pgfifo's constraint name is not one.
        assert_eq!(refusal(&db_error(DatabaseErrorKind::Unknown, None)), None);
        let check = db_error(DatabaseErrorKind::CheckViolation, Some("job_queue_check"));
        assert_eq!(refusal(&check), None);
        assert_eq!(refusal(&Error::NotFound), None);
    }

    #[test]
    fn connection_errors_are_told_from_sql_errors() {
        assert!(is_connection_error(&db_error(
            DatabaseErrorKind::ClosedConnection,
            None
        )));
        assert!(is_connection_error(&db_error(
            DatabaseErrorKind::UnableToSendCommand,
            None
        )));
        assert!(is_connection_error(&Error::BrokenTransactionManager));
        assert!(!is_connection_error(&db_error(
            DatabaseErrorKind::UniqueViolation,
            None
        )));
        assert!(is_connection_error(&timed_out(
            std::time::Duration::from_secs(1)
        )));
        let read_only = db_error(DatabaseErrorKind::ReadOnlyTransaction, None);
        assert!(is_read_only(&read_only) && must_replace(&read_only));
        assert!(!is_connection_error(&read_only));
        assert!(!must_replace(&db_error(DatabaseErrorKind::Unknown, None)));
        assert!(!is_connection_error(&db_error(
            DatabaseErrorKind::Unknown,
            Some("pgfifo_group_busy")
        )));
    }
}

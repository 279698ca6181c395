//! The order-aware check from the database's own records: a group's jobs
//! started in enqueue order, each only once the one before it was done.

use diesel_async::AsyncPgConnection;

use crate::db::testing::{self as tsql, GroupRun};
use crate::names::{validate_group, validate_queue};
use crate::Result;

/// Checks, from the attempt records (`pgfifo.job_attempt`), that the jobs
/// of group `group` of queue `queue` that ran started in enqueue order, and
/// one at a time: every attempt of a job started before the first attempt
/// of any later job of the group, and a job started only when every earlier
/// job of the group that ran was final. Works after a [`Drain`](super::Drain)
/// and after a real runner alike (attempts that were interrupted count;
/// snoozed attempts leave no record).
///
/// Returns `Ok(Err(problem))` when the order was broken, naming the jobs;
/// `Err` for an invalid name or a database error. It does not apply to a
/// group whose concurrency is above 1, whose jobs may overlap by design.
pub async fn check_group_ran_in_order(
    conn: &mut AsyncPgConnection,
    queue: &str,
    group: &str,
) -> Result<std::result::Result<(), String>> {
    validate_queue(queue)?;
    validate_group(group)?;
    let runs = tsql::group_runs(conn, queue, group).await?;
    Ok(check(&runs))
}

/// Asserts [`check_group_ran_in_order`].
///
/// # Panics
///
/// When the order was broken (listing the group's jobs and their starts),
/// or the records cannot be read.
pub async fn assert_group_ran_in_order(conn: &mut AsyncPgConnection, queue: &str, group: &str) {
    let checked = check_group_ran_in_order(conn, queue, group)
        .await
        .unwrap_or_else(|err| panic!("assert_group_ran_in_order: {err}"));
    if let Err(problem) = checked {
        let runs = tsql::group_runs(conn, queue, group)
            .await
            .map(|runs| {
                runs.iter()
                    .map(|r| {
                        format!(
                            "\n  #{} {} {} starts {:?}..{:?}",
                            r.id, r.kind, r.state, r.first_start_us, r.last_start_us
                        )
                    })
                    .collect::<String>()
            })
            .unwrap_or_default();
        panic!("group {group:?} of queue {queue:?}: {problem}; its jobs in enqueue order:{runs}");
    }
}

fn check(runs: &[GroupRun]) -> std::result::Result<(), String> {
    let mut before: Option<&GroupRun> = None;
    for run in runs {
        let Some(first) = run.first_start_us else {
            continue;
        };
        if let Some(prev) = before {
            let prev_last = prev.last_start_us.unwrap_or(i64::MIN);
            if first < prev_last {
                return Err(format!(
                    "job {} started before job {} (enqueued before it) had made its last attempt",
                    run.id, prev.id
                ));
            }
            if prev.state == "queued" {
                return Err(format!(
                    "job {} started while job {} (enqueued before it) was still queued",
                    run.id, prev.id
                ));
            }
        }
        before = Some(run);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(id: i64, state: &str, first: Option<i64>, last: Option<i64>) -> GroupRun {
        GroupRun {
            id,
            kind: "k".into(),
            state: state.into(),
            first_start_us: first,
            last_start_us: last,
        }
    }

    #[test]
    fn in_order_passes_and_overlap_or_overtaking_fails() {
        let ok = [
            run(1, "succeeded", Some(1), Some(5)),
            run(2, "queued", Some(6), Some(6)),
            run(3, "queued", None, None),
        ];
        assert_eq!(check(&ok), Ok(()));
        let overtaken = [
            run(1, "succeeded", Some(4), Some(4)),
            run(2, "succeeded", Some(2), Some(2)),
        ];
        assert!(check(&overtaken)
            .unwrap_err()
            .contains("job 2 started before job 1"));
        let overlapped = [
            run(1, "queued", Some(1), Some(1)),
            run(2, "succeeded", Some(2), Some(2)),
        ];
        assert!(check(&overlapped).unwrap_err().contains("still queued"));
    }
}

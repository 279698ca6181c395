//! Setting the limits of groups at run time: a queue's defaults and a
//! group's own. Each call is one short transaction; none waits for a
//! running job. A change applies from the next start of each group: groups
//! waiting for a token are woken and timed again by the new limits.

use std::time::Duration;

use diesel_async::AsyncPgConnection;
use serde::Serialize;

use crate::db;
use crate::db::admin::controls::{ControlRow, ControlValues};
use crate::db::pooler::pinned;
use crate::names::{validate_group, validate_queue};
use crate::{Error, GroupLimits, GroupLimitsChange, Rate, Result};

/// Sets the limits of one group of `queue`, replacing those it had; a field
/// left `None` takes the queue's default. The group need not have had a
/// job yet: limits set ahead apply from its first one (so a misspelt group
/// name is not an error; [`limits`] lists what is set).
///
/// ```no_run
/// # async fn run(conn: &mut pgfifo::diesel_async::AsyncPgConnection) -> pgfifo::Result<()> {
/// use pgfifo::{admin, GroupLimits, Rate};
///
/// // Tenant 42's upstream allows 10 calls a second, 20 at once.
/// let limits = GroupLimits::new().rate(Rate::per_second(10)?).burst(20);
/// admin::set_group_limits(conn, "sync", "tenant-42", limits).await?;
/// # Ok(())
/// # }
/// ```
pub async fn set_group_limits(
    conn: &mut AsyncPgConnection,
    queue: &str,
    group: &str,
    limits: GroupLimits,
) -> Result<()> {
    validate_group(group)?;
    set(conn, queue, Some(group), limits).await
}

/// Sets the defaults for every group of `queue` that has no limits of its
/// own (a field left `None`: no limit of that kind).
pub async fn set_default_group_limits(
    conn: &mut AsyncPgConnection,
    queue: &str,
    limits: GroupLimits,
) -> Result<()> {
    set(conn, queue, None, limits).await
}

/// Puts a group back on its queue's defaults. Returns `false` if it had no
/// limits of its own.
pub async fn reset_group_limits(
    conn: &mut AsyncPgConnection,
    queue: &str,
    group: &str,
) -> Result<bool> {
    validate_group(group)?;
    reset(conn, queue, Some(group)).await
}

/// Removes `queue`'s defaults: its groups without limits of their own have
/// none. Returns `false` if there were none.
pub async fn reset_default_group_limits(conn: &mut AsyncPgConnection, queue: &str) -> Result<bool> {
    reset(conn, queue, None).await
}

/// Changes some limits of one group of `queue` (`Some(group)`) or of its
/// defaults (`None`) and keeps the others, in one statement: two changes
/// of different limits made at once both hold. Returns what is set there
/// now, `None` when nothing is (a change that clears the last setting
/// removes the group's own limits, as [`reset_group_limits`] does).
///
/// ```no_run
/// # async fn run(conn: &mut pgfifo::diesel_async::AsyncPgConnection) -> pgfifo::Result<()> {
/// use pgfifo::{admin, GroupLimitsChange, LimitChange};
///
/// // Tenant 42 runs 4 at once from now on; its rate stays as it was.
/// let change = GroupLimitsChange { concurrency: LimitChange::Set(4), ..Default::default() };
/// admin::change_group_limits(conn, "sync", Some("tenant-42"), change).await?;
/// # Ok(())
/// # }
/// ```
pub async fn change_group_limits(
    conn: &mut AsyncPgConnection,
    queue: &str,
    group: Option<&str>,
    change: GroupLimitsChange,
) -> Result<Option<SetLimits>> {
    validate_queue(queue)?;
    if let Some(group) = group {
        validate_group(group)?;
    }
    let limits = change.values()?;
    let values = control_values(&limits);
    let changed = change.changed();
    pinned(conn, async |conn| {
        let row =
            db::admin::controls::change_group_control(conn, queue, group, &changed, values).await?;
        Ok(row.map(set_limits))
    })
    .await
}

/// Limits set in a queue (see [`limits`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SetLimits {
    /// The group, or `None` for the queue's defaults.
    pub group: Option<String>,
    /// The rate, if set here.
    #[serde(serialize_with = "ser_opt_rate")]
    pub rate: Option<Rate>,
    /// The burst, if set here.
    pub burst: Option<u32>,
    /// The concurrency, if set here.
    pub concurrency: Option<u32>,
    /// The weight, if set here.
    pub weight: Option<u32>,
}

/// The limits set in `queue`: its defaults first (if any), then the groups
/// with limits of their own in name order, after `after`, at most `limit`
/// rows.
pub async fn limits(
    conn: &mut AsyncPgConnection,
    queue: &str,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<SetLimits>> {
    pinned(conn, async |conn| {
        validate_queue(queue)?;
        if limit < 1 {
            return Err(Error::InvalidArgument(format!(
                "limit must be at least 1 (got {limit})"
            )));
        }
        let rows = db::admin::controls::controls(conn, queue, after, limit).await?;
        Ok(rows.into_iter().map(set_limits).collect())
    })
    .await
}

/// The limits set for one group (`Some(group)`) or as `queue`'s defaults
/// (`None`): `None` when nothing is set there.
pub async fn limits_of(
    conn: &mut AsyncPgConnection,
    queue: &str,
    group: Option<&str>,
) -> Result<Option<SetLimits>> {
    pinned(conn, async |conn| {
        validate_queue(queue)?;
        if let Some(group) = group {
            validate_group(group)?;
        }
        let row = db::admin::controls::control(conn, queue, group.unwrap_or("")).await?;
        Ok(row.map(set_limits))
    })
    .await
}

async fn set(
    conn: &mut AsyncPgConnection,
    queue: &str,
    group: Option<&str>,
    limits: GroupLimits,
) -> Result<()> {
    validate_queue(queue)?;
    limits.validate()?;
    let values = control_values(&limits);
    pinned(conn, async |conn| {
        db::admin::controls::set_group_control(conn, queue, group, values, false).await?;
        Ok(())
    })
    .await
}

async fn reset(conn: &mut AsyncPgConnection, queue: &str, group: Option<&str>) -> Result<bool> {
    validate_queue(queue)?;
    pinned(conn, async |conn| {
        let values = ControlValues::default();
        Ok(db::admin::controls::set_group_control(conn, queue, group, values, true).await?)
    })
    .await
}

/// `limits` as the database takes them.
fn control_values(limits: &GroupLimits) -> ControlValues {
    ControlValues {
        rate_count: limits.rate.map(|rate| rate.count() as i32),
        rate_period_ms: limits.rate.map(Rate::period_ms),
        burst: limits.burst.map(|burst| burst as i32),
        concurrency: limits.concurrency.map(|n| n as i32),
        weight: limits.weight.map(|n| n as i32),
    }
}

fn set_limits(row: ControlRow) -> SetLimits {
    SetLimits {
        group: Some(row.group_id).filter(|g| !g.is_empty()),
        rate: rate_of(row.rate_count, row.rate_period_ms),
        burst: row.burst.map(|b| b as u32),
        concurrency: row.concurrency.map(|n| n as u32),
        weight: row.weight.map(|n| n as u32),
    }
}

/// A stored rate (rows always hold valid ones: the table's checks).
pub(super) fn rate_of(count: Option<i32>, period_ms: Option<i64>) -> Option<Rate> {
    match (count, period_ms) {
        (Some(count), Some(ms)) => Rate::new(count as u32, Duration::from_millis(ms as u64)).ok(),
        _ => None,
    }
}

/// A rate as its text (`10/s`), for JSON.
pub(super) fn ser_opt_rate<S: serde::Serializer>(
    rate: &Option<Rate>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    match rate {
        Some(rate) => s.serialize_some(&rate.to_string()),
        None => s.serialize_none(),
    }
}

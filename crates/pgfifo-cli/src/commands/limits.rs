//! `pgfifo group set|reset|limits`: the limits of a queue's groups (rate,
//! burst, concurrency, weight), a group's own and the queue's defaults.
//! The command line's types are here too, so that `main.rs` only routes.

use clap::{ArgGroup, Args, Subcommand};
use pgfifo::admin::{self, SetLimits};
use pgfifo::diesel_async::AsyncPgConnection;
use pgfifo::{GroupLimitsChange, LimitChange, Rate, MAX_GROUP_CONCURRENCY, MAX_RATE_COUNT};
use serde::Serialize;

use crate::args::limit;
use crate::error::CliResult;
use crate::output::{fields, or_dash, Output, Table};

/// `pgfifo group --help`.
pub const ABOUT: &str = "\
Set, reset and list the limits of a queue's groups.

A group's limits are its own settings, and for each setting it has not set,
its queue's default (`--defaults`). Without either, a group has no rate limit,
runs one job at a time and has weight 1. A change applies from each group's
next start: running jobs are not interrupted, and groups waiting for a token
are timed again by the new limits.";

/// `pgfifo group ...`.
#[derive(Debug, Subcommand)]
pub enum GroupAction {
    /// Change some limits of a group, or the queue's defaults
    ///
    /// Changes the settings given, of one group or (with --defaults) of the
    /// queue's defaults, and keeps the others. `none` clears a setting: a
    /// group then takes the queue's default for it; the queue's defaults
    /// then have no limit of that kind. Prints the settings after the
    /// change. A bad value is refused (exit 2) and changes nothing.
    #[command(
        override_usage = "pgfifo group set <QUEUE> <GROUP|--defaults> [--rate <RATE|none>] \
                                [--burst <N|none>] [--concurrency <N|none>] [--weight <N|none>]"
    )]
    Set(SetArgs),
    /// Remove the limits of a group, or the queue's defaults
    ///
    /// Removes every setting of one group, which then follows the queue's
    /// defaults, or (with --defaults) the queue's defaults, so that groups
    /// without settings of their own have no limits. Says whether anything
    /// was set.
    #[command(override_usage = "pgfifo group reset <QUEUE> <GROUP|--defaults>")]
    Reset(Target),
    /// List the limits set in a queue: its defaults, then groups by name
    ///
    /// Shows what is set, not what applies: `-` is a setting left to the
    /// queue's default (for the defaults row: no limit, burst equal to the
    /// rate's count, concurrency 1, weight 1). Page with --after and --limit.
    Limits(ListArgs),
}

/// The group, or the queue's defaults, that `set` and `reset` change.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("target").required(true).args(["group", "defaults"])))]
pub struct Target {
    /// The queue.
    queue: String,
    /// The group.
    group: Option<String>,
    /// The queue's defaults instead of one group: they apply to every group
    /// of the queue for the settings it has not set itself.
    #[arg(long)]
    defaults: bool,
}

/// `pgfifo group set`.
#[derive(Debug, Args)]
#[command(group(
    ArgGroup::new("settings")
        .required(true)
        .multiple(true)
        .args(["rate", "burst", "concurrency", "weight"])
))]
pub struct SetArgs {
    #[command(flatten)]
    target: Target,
    /// At most this many job starts per period, on average, across all
    /// runners: COUNT/PERIOD, the period a unit (ms, s, m, h, d) with an
    /// optional whole number before it: 10/s, 600/5m, 1/250ms. A group with
    /// no token left waits for the next one without using an attempt. `none`
    /// clears it.
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    rate: Option<Setting<Rate>>,
    /// How many starts may happen at once after a quiet spell: the size of
    /// the group's token bucket, 1 to 1000000 (default: the rate's count).
    /// `none` clears it.
    #[arg(long, value_name = "N", value_parser = parse_burst, allow_hyphen_values = true)]
    burst: Option<Setting<u32>>,
    /// How many jobs of the group may run at once, 1 to 1000 (default 1).
    /// They start in FIFO order. `none` clears it.
    #[arg(long, value_name = "N", value_parser = parse_concurrency, allow_hyphen_values = true)]
    concurrency: Option<Setting<u32>>,
    /// The group's share of turns among groups with jobs waiting when there
    /// are more of them than free runner slots, 1 to 1000 (default 1).
    /// `none` clears it.
    #[arg(long, value_name = "N", value_parser = parse_weight, allow_hyphen_values = true)]
    weight: Option<Setting<u32>>,
}

/// `pgfifo group limits`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// The queue.
    queue: String,
    /// Groups after this one in name order (for paging; leaves out the
    /// defaults row).
    #[arg(long, value_name = "G")]
    after: Option<String>,
    /// At most this many rows.
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = limit())]
    limit: i64,
}

/// One setting on the command line: a value, or `none` to clear it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting<T> {
    /// `none`.
    Clear,
    /// A value.
    To(T),
}

impl<T> Setting<T> {
    /// What the library does with this setting, when one is given.
    fn change(setting: Option<Self>) -> LimitChange<T> {
        match setting {
            None => LimitChange::Keep,
            Some(Setting::Clear) => LimitChange::Clear,
            Some(Setting::To(value)) => LimitChange::Set(value),
        }
    }
}

pub(crate) fn parse_rate(text: &str) -> Result<Setting<Rate>, String> {
    if text == "none" {
        return Ok(Setting::Clear);
    }
    text.parse().map(Setting::To).map_err(|err| match err {
        pgfifo::Error::InvalidArgument(message) => message,
        other => other.to_string(),
    })
}

fn parse_burst(text: &str) -> Result<Setting<u32>, String> {
    parse_count("burst", text, MAX_RATE_COUNT)
}

fn parse_concurrency(text: &str) -> Result<Setting<u32>, String> {
    parse_count("concurrency", text, MAX_GROUP_CONCURRENCY)
}

fn parse_weight(text: &str) -> Result<Setting<u32>, String> {
    parse_count("weight", text, MAX_GROUP_CONCURRENCY)
}

/// `none`, or a whole number from 1 to `max`; the error names `setting`.
/// (The library checks the same ranges again; this refuses a bad value
/// before the database is reached.)
pub(crate) fn parse_count(setting: &str, text: &str, max: u32) -> Result<Setting<u32>, String> {
    if text == "none" {
        return Ok(Setting::Clear);
    }
    let n: i64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{setting}: {text:?} is not a whole number or none"))?;
    match u32::try_from(n) {
        Ok(n) if (1..=max).contains(&n) => Ok(Setting::To(n)),
        _ => Err(format!("{setting}: {n} is outside 1 to {max}")),
    }
}

/// Runs one `pgfifo group` command.
pub async fn run(conn: &mut AsyncPgConnection, out: Output, action: GroupAction) -> CliResult {
    match action {
        GroupAction::Set(args) => set(conn, out, args).await,
        GroupAction::Reset(target) => reset(conn, out, target).await,
        GroupAction::Limits(args) => list(conn, out, args).await,
    }
}

/// The settings of a group or of a queue's defaults, as `set` prints them.
#[derive(Debug, Serialize)]
struct Shown<'a> {
    queue: &'a str,
    #[serde(flatten)]
    limits: SetLimits,
}

/// `pgfifo group set`: changes the settings given and keeps the others,
/// in one statement (two `set`s of different settings at once both hold).
/// When no setting is left, the row is removed, which is the same as a row
/// without settings.
async fn set(conn: &mut AsyncPgConnection, out: Output, args: SetArgs) -> CliResult {
    let queue = args.target.queue.as_str();
    let group = args.target.group.as_deref();
    let change = GroupLimitsChange {
        rate: Setting::change(args.rate),
        burst: Setting::change(args.burst),
        concurrency: Setting::change(args.concurrency),
        weight: Setting::change(args.weight),
    };
    let now = admin::change_group_limits(conn, queue, group, change).await?;
    let shown = Shown {
        queue,
        limits: now.unwrap_or_else(|| unset(group)),
    };
    out.emit(&shown, |s| {
        let l = &s.limits;
        // What applies to a setting left unset.
        let [rate, burst, concurrency, weight] = match l.group {
            Some(_) => [
                "the queue's default",
                "the queue's default, else the rate's count",
                "the queue's default, else 1",
                "the queue's default, else 1",
            ],
            None => ["no rate limit", "the rate's count", "1", "1"],
        };
        format!(
            "{}:\n{}",
            place(s.queue, l.group.as_deref()),
            fields(&[
                ("rate", setting(l.rate, rate)),
                ("burst", setting(l.burst, burst)),
                ("concurrency", setting(l.concurrency, concurrency)),
                ("weight", setting(l.weight, weight)),
            ])
        )
    })
}

/// No settings, for `group` (`None`: the queue's defaults).
fn unset(group: Option<&str>) -> SetLimits {
    SetLimits {
        group: group.map(str::to_owned),
        rate: None,
        burst: None,
        concurrency: None,
        weight: None,
    }
}

/// `group G of queue Q`, or `defaults of queue Q`.
fn place(queue: &str, group: Option<&str>) -> String {
    match group {
        Some(group) => format!("group {group} of queue {queue}"),
        None => format!("defaults of queue {queue}"),
    }
}

/// A setting for people; one not set says what applies instead.
fn setting<T: std::fmt::Display>(value: Option<T>, otherwise: &str) -> String {
    match value {
        Some(value) => value.to_string(),
        None => format!("- ({otherwise})"),
    }
}

/// What `reset` did.
#[derive(Debug, Serialize)]
struct Reset<'a> {
    queue: &'a str,
    /// The group, or `None` for the queue's defaults.
    group: Option<&'a str>,
    /// `false` when nothing was set.
    changed: bool,
}

/// `pgfifo group reset`: removes a group's limits or the queue's defaults.
async fn reset(conn: &mut AsyncPgConnection, out: Output, target: Target) -> CliResult {
    let queue = target.queue.as_str();
    let group = target.group.as_deref();
    let changed = match group {
        Some(group) => admin::reset_group_limits(conn, queue, group).await?,
        None => admin::reset_default_group_limits(conn, queue).await?,
    };
    let report = Reset {
        queue,
        group,
        changed,
    };
    out.emit(&report, |r| match (r.group, r.changed) {
        (Some(group), true) => format!(
            "removed the limits of group {group} of queue {}: it follows the queue's defaults",
            r.queue
        ),
        (Some(group), false) => format!(
            "group {group} of queue {} had no limits of its own: nothing changed",
            r.queue
        ),
        (None, true) => format!(
            "removed the defaults of queue {}: groups without settings of their own have no limits",
            r.queue
        ),
        (None, false) => format!("queue {} had no defaults: nothing changed", r.queue),
    })
}

/// `pgfifo group limits QUEUE`: what is set, defaults first.
async fn list(conn: &mut AsyncPgConnection, out: Output, args: ListArgs) -> CliResult {
    let rows = admin::limits(conn, &args.queue, args.after.as_deref(), args.limit).await?;
    let full = rows.len() as i64 >= args.limit;
    out.emit(&rows, |rows| {
        if rows.is_empty() {
            return format!("no limits set in queue {}", args.queue);
        }
        let mut table = Table::new(&["GROUP", "RATE", "BURST", "CONCURRENCY", "WEIGHT"]);
        for r in rows {
            table.row(vec![
                r.group.clone().unwrap_or_else(|| "(defaults)".to_owned()),
                or_dash(r.rate),
                or_dash(r.burst),
                or_dash(r.concurrency),
                or_dash(r.weight),
            ]);
        }
        let mut text = table.render();
        if full {
            let last = rows.last().and_then(|r| r.group.as_deref()).unwrap_or("");
            text.push_str(&format!("\nmore may follow: --after {last:?}\n"));
        }
        text
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_with_none_and_name_the_setting_when_bad() {
        assert_eq!(parse_burst("20"), Ok(Setting::To(20)));
        assert_eq!(parse_weight("none"), Ok(Setting::Clear));
        assert_eq!(parse_rate("none"), Ok(Setting::Clear));
        assert_eq!(
            parse_rate("600/5m").unwrap(),
            Setting::To("600/5m".parse().unwrap())
        );
        for (result, name) in [
            (parse_rate("0/s").map(|_| ()), "rate:"),
            (parse_rate("fast").map(|_| ()), "rate:"),
            (parse_burst("0").map(|_| ()), "burst:"),
            (parse_burst("-1").map(|_| ()), "burst:"),
            (parse_concurrency("5000").map(|_| ()), "concurrency:"),
            (parse_concurrency("x").map(|_| ()), "concurrency:"),
            (parse_weight("0").map(|_| ()), "weight:"),
        ] {
            let err = result.unwrap_err();
            assert!(err.starts_with(name), "{err}");
        }
    }

    #[test]
    fn a_setting_left_out_keeps_none_clears_a_value_sets() {
        assert_eq!(Setting::<u32>::change(None), LimitChange::Keep);
        assert_eq!(
            Setting::<u32>::change(Some(Setting::Clear)),
            LimitChange::Clear
        );
        assert_eq!(Setting::change(Some(Setting::To(4))), LimitChange::Set(4));
    }
}

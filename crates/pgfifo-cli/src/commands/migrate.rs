//! `pgfifo migrate up | down N | status | distribute`.

use clap::Subcommand;
use pgfifo::diesel_async::AsyncPgConnection;
use pgfifo::migrate::{
    self, Distributed, FunctionsStatus, Layout, MigrationStatus, SchemaStatus, MIGRATIONS,
};
use serde::Serialize;

use crate::error::{CliError, CliResult};
use crate::output::{plural, yes_no, Output, Table};

/// `pgfifo migrate ...`.
#[derive(Debug, Subcommand)]
pub enum MigrateAction {
    /// Apply every pending migration
    ///
    /// Idempotent, and safe to run from several processes at once.
    Up,
    /// Revert the newest N applied migrations
    ///
    /// Reverting the first migration drops the pgfifo schema with every job
    /// in it. Nothing is reverted (exit 1) when fewer than N are applied.
    Down {
        /// How many migrations to revert (at least 1, at most the number applied).
        #[arg(value_parser = clap::value_parser!(u32).range(1..))]
        n: u32,
    },
    /// List the migrations this tool knows and whether each is applied
    Status,
    /// Spread pgfifo's tables over a Citus cluster (the distributed layout)
    ///
    /// Run on the Citus coordinator after `migrate up`, with runners
    /// stopped: it copies every row, in one transaction. There is no way
    /// back to the plain layout. Refused on a database without Citus, on a
    /// worker node, and where a group's weight is set; a second run does
    /// nothing. See docs/scaling.md for what runs on that layout.
    Distribute,
}

/// A migration as `up` and `down` report it.
#[derive(Debug, Serialize)]
struct MigrationLine {
    version: i64,
    name: String,
    release: Option<String>,
}

/// The result of `up` and `down`: the migrations applied or reverted.
#[derive(Debug, Serialize)]
struct Change {
    /// `applied` or `reverted`.
    action: &'static str,
    migrations: Vec<MigrationLine>,
    /// Whether `up` installed the functions.
    functions_installed: bool,
}

/// The known migration with this version, as a line.
fn line(version: i64) -> MigrationLine {
    let known = MIGRATIONS.iter().find(|m| m.version == version);
    MigrationLine {
        version,
        name: known.map_or("?", |m| m.name).to_owned(),
        release: known.map(|m| m.release.to_owned()),
    }
}

/// Renders `migrations` as a VERSION / NAME / RELEASE table.
fn versions(migrations: &[MigrationLine]) -> String {
    let mut table = Table::new(&["VERSION", "NAME", "RELEASE"]);
    for m in migrations {
        table.row(vec![
            m.version.to_string(),
            m.name.clone(),
            m.release.clone().unwrap_or_else(|| "?".into()),
        ]);
    }
    table.render()
}

/// `pgfifo migrate up`: applies every pending migration and installs the
/// functions if they are not this release's.
pub async fn up(conn: &mut AsyncPgConnection, out: Output) -> CliResult {
    let migrated = migrate::migrate_conn(conn).await?;
    let change = Change {
        action: "applied",
        migrations: migrated.applied.iter().map(|&v| line(v)).collect(),
        functions_installed: migrated.functions_installed,
    };
    out.emit(&change, |c| {
        let mut text = Vec::new();
        if !c.migrations.is_empty() {
            text.push(format!("applied:\n{}", versions(&c.migrations)));
        }
        if c.functions_installed {
            text.push(format!(
                "installed the functions of pgfifo {}",
                migrate::RELEASE
            ));
        }
        if text.is_empty() {
            text.push(format!(
                "the schema is up to date (version {}, pgfifo {})",
                migrate::latest_version(),
                migrate::RELEASE
            ));
        }
        text.join("\n")
    })
}

/// `pgfifo migrate down N`: reverts the newest `n` applied migrations, or
/// nothing (exit 1) when fewer are applied.
pub async fn down(conn: &mut AsyncPgConnection, out: Output, n: usize) -> CliResult {
    let applied = migrate::status(conn)
        .await?
        .migrations
        .iter()
        .filter(|m| m.applied)
        .count();
    if n > applied {
        return Err(CliError::failure(format!(
            "cannot revert {n} migration{}: {applied} {} applied; nothing was reverted",
            plural(n),
            if applied == 1 { "is" } else { "are" },
        )));
    }
    let reverted = migrate::rollback(conn, n).await?;
    let change = Change {
        action: "reverted",
        migrations: reverted.into_iter().map(line).collect(),
        functions_installed: false,
    };
    out.emit(&change, |c| {
        format!(
            "reverted:\n{}\n(the functions stay as installed; see docs/upgrading.md)",
            versions(&c.migrations)
        )
    })
}

/// The result of `distribute`.
#[derive(Debug, Serialize)]
struct DistributeResult {
    /// Always `distributed`.
    layout: &'static str,
    /// Whether this run laid the tables out (false: they already were).
    changed: bool,
}

/// `pgfifo migrate distribute`: lays pgfifo's tables out over the Citus
/// cluster whose coordinator this is (`pgfifo::migrate::distribute`).
pub async fn distribute(conn: &mut AsyncPgConnection, out: Output) -> CliResult {
    let done = migrate::distribute(conn).await?;
    let result = DistributeResult {
        layout: "distributed",
        changed: done == Distributed::Now,
    };
    out.emit(&result, |r| {
        if r.changed {
            "laid pgfifo's tables out over the Citus cluster (layout: distributed; docs/scaling.md)"
                .to_owned()
        } else {
            "the tables are already distributed over the Citus cluster; nothing to do".to_owned()
        }
    })
}

/// `pgfifo migrate status`: every known migration and whether it is
/// applied, and whether the functions are this release's.
pub async fn status(conn: &mut AsyncPgConnection, out: Output) -> CliResult {
    let status = migrate::status(conn).await?;
    out.emit(&status, render_status)
}

fn render_status(status: &SchemaStatus) -> String {
    let mut table = Table::new(&["VERSION", "NAME", "RELEASE", "APPLIED"]);
    for MigrationStatus {
        version,
        name,
        release,
        applied,
    } in &status.migrations
    {
        table.row(vec![
            version.to_string(),
            name.clone(),
            release.clone().unwrap_or_else(|| "(newer)".into()),
            yes_no(*applied),
        ]);
    }
    let functions = match &status.functions {
        FunctionsStatus::Current => format!("functions: pgfifo {}'s", migrate::RELEASE),
        FunctionsStatus::Different { installed_by } => {
            format!("functions: installed by pgfifo {installed_by}, not by this release")
        }
        FunctionsStatus::Unrecorded => "functions: those of the migrations applied".to_owned(),
    };
    let pending = status.pending().count();
    let newer = status.migrations.iter().any(|m| m.release.is_none());
    let summary = if newer {
        format!(
            "the database has migrations this release (pgfifo {}) does not know: run the newer release",
            migrate::RELEASE
        )
    } else if status.is_current() {
        "the schema is up to date".to_owned()
    } else if pending > 0 {
        format!(
            "{pending} pending migration{}: run `pgfifo migrate up`",
            plural(pending)
        )
    } else {
        "the functions are not this release's: run `pgfifo migrate up`".to_owned()
    };
    let layout = match status.layout {
        Layout::Plain => String::new(),
        Layout::Distributed => "layout: distributed over Citus (docs/scaling.md)\n".to_owned(),
    };
    format!("{}\n{functions}\n{layout}{summary}", table.render())
}

//! `pgfifo migrate up | down N | status`.

use pgfifo::diesel_async::AsyncPgConnection;
use pgfifo::migrate::{self, MIGRATIONS};
use serde::Serialize;

use crate::error::{CliError, CliResult};
use crate::output::{plural, yes_no, Output, Table};

/// A migration as reported by the commands (`pgfifo::migrate::MigrationStatus`
/// has no `Serialize`).
#[derive(Debug, Serialize)]
struct MigrationLine {
    version: i64,
    name: String,
    applied: bool,
}

/// The result of `up` and `down`: the migrations applied or reverted.
#[derive(Debug, Serialize)]
struct Change {
    /// `applied` or `reverted`.
    action: &'static str,
    migrations: Vec<MigrationLine>,
}

/// The known migration with this version, as a line.
fn line(version: i64, applied: bool) -> MigrationLine {
    MigrationLine {
        version,
        name: MIGRATIONS
            .iter()
            .find(|m| m.version == version)
            .map_or("?", |m| m.name)
            .to_owned(),
        applied,
    }
}

/// Renders `migrations` as a VERSION / NAME table.
fn versions(migrations: &[MigrationLine]) -> String {
    let mut table = Table::new(&["VERSION", "NAME"]);
    for m in migrations {
        table.row(vec![m.version.to_string(), m.name.clone()]);
    }
    table.render()
}

/// `pgfifo migrate up`: applies every pending migration.
pub async fn up(conn: &mut AsyncPgConnection, out: Output) -> CliResult {
    let applied = migrate::migrate_conn(conn).await?;
    let change = Change {
        action: "applied",
        migrations: applied.into_iter().map(|v| line(v, true)).collect(),
    };
    out.emit(&change, |c| {
        if c.migrations.is_empty() {
            format!(
                "the schema is up to date (version {})",
                migrate::latest_version()
            )
        } else {
            format!("applied:\n{}", versions(&c.migrations))
        }
    })
}

/// `pgfifo migrate down N`: reverts the newest `n` applied migrations, or
/// nothing (exit 1) when fewer are applied.
pub async fn down(conn: &mut AsyncPgConnection, out: Output, n: usize) -> CliResult {
    let applied = migrate::status(conn)
        .await?
        .into_iter()
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
        migrations: reverted.into_iter().map(|v| line(v, false)).collect(),
    };
    out.emit(&change, |c| {
        format!("reverted:\n{}", versions(&c.migrations))
    })
}

/// `pgfifo migrate status`: every known migration and whether it is applied.
pub async fn status(conn: &mut AsyncPgConnection, out: Output) -> CliResult {
    let lines: Vec<MigrationLine> = migrate::status(conn)
        .await?
        .into_iter()
        .map(|m| MigrationLine {
            version: m.version,
            name: m.name,
            applied: m.applied,
        })
        .collect();
    out.emit(&lines, |lines| {
        let mut table = Table::new(&["VERSION", "NAME", "APPLIED"]);
        for m in lines {
            table.row(vec![
                m.version.to_string(),
                m.name.clone(),
                yes_no(m.applied),
            ]);
        }
        let pending = lines.iter().filter(|m| !m.applied).count();
        let summary = match pending {
            0 => "the schema is up to date".to_owned(),
            n => format!(
                "{n} pending migration{}: run `pgfifo migrate up`",
                plural(n)
            ),
        };
        format!("{}\n{summary}", table.render())
    })
}

//! A small application's jobs, to show `pgfifo::testing` on them (see
//! `tests/` and docs/testing.md). Onboarding a tenant: `CreateAccount`
//! writes the account and enqueues `SendWelcome` for the same tenant;
//! `SyncCrm` fails on its first attempt; `Reminder` snoozes its group once,
//! and cancels itself when there is nobody to remind; `Export` runs in
//! long mode.
//!
//! Run its tests with `cargo test -p pgfifo-testing-demo`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use pgfifo::diesel::sql_types::Text;
use pgfifo::diesel_async::RunQueryDsl;
use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
use serde::{Deserialize, Serialize};

/// The table the handlers write to (the application's own schema).
pub const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS account (tenant text PRIMARY KEY, \
                          name text NOT NULL, welcomed boolean NOT NULL DEFAULT false); \
                          CREATE TABLE IF NOT EXISTS export_step (name text NOT NULL, \
                          attempt integer NOT NULL)";

/// Creates a tenant's account, then enqueues its welcome mail in the same
/// transaction (the mail goes out only if the account commits).
#[derive(Job, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[job(queue = "onboarding", max_attempts = 3)]
pub struct CreateAccount {
    /// The account's name.
    pub name: String,
}

#[async_trait]
impl Handler for CreateAccount {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let tenant = ctx
            .group()
            .ok_or_else(|| JobError::permanent("CreateAccount needs a tenant group"))?
            .to_owned();
        pgfifo::diesel::sql_query("INSERT INTO account (tenant, name) VALUES ($1, $2)")
            .bind::<Text, _>(&tenant)
            .bind::<Text, _>(&self.name)
            .execute(ctx.conn())
            .await?;
        let welcome = SendWelcome {
            greeting: format!("Welcome, {}!", self.name),
        };
        welcome.enqueue(ctx.conn(), &tenant).await?;
        ctx.set_result(&tenant)?;
        Ok(())
    }
}

/// Marks the tenant's account welcomed (a mail, in a real application).
#[derive(Job, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[job(queue = "onboarding")]
pub struct SendWelcome {
    /// The mail's first line.
    pub greeting: String,
}

#[async_trait]
impl Handler for SendWelcome {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let tenant = ctx.group().unwrap_or_default().to_owned();
        let updated =
            pgfifo::diesel::sql_query("UPDATE account SET welcomed = true WHERE tenant = $1")
                .bind::<Text, _>(&tenant)
                .execute(ctx.conn())
                .await?;
        if updated == 0 {
            return Err(JobError::retry(format!("no account for {tenant} yet")));
        }
        Ok(())
    }
}

/// Pushes the tenant to a CRM that is down on the first attempt.
#[derive(Job, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[job(queue = "crm", max_attempts = 3, backoff = "1h")]
pub struct SyncCrm {
    /// A label, to tell jobs apart.
    pub label: String,
}

#[async_trait]
impl Handler for SyncCrm {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        if ctx.attempt() == 1 {
            return Err(JobError::retry("the CRM is down"));
        }
        Ok(())
    }
}

/// Whether a [`Reminder`] has snoozed in this process.
static SNOOZED: AtomicBool = AtomicBool::new(false);

/// Reminds a tenant: snoozes its group once (attempts stay as they are),
/// and cancels itself when `nobody` is set.
/// Its snooze is taken once per process.
#[derive(Job, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[job(queue = "reminders")]
pub struct Reminder {
    /// Whether there is nobody to remind (the job cancels itself).
    pub nobody: bool,
    /// Whether it snoozes its group (the first such run in the process).
    pub snooze_first: bool,
}

#[async_trait]
impl Handler for Reminder {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        if self.nobody {
            return Err(JobError::cancel("nobody to remind"));
        }
        // Once per process (a snoozed run's writes are discarded, so the
        // handler cannot note it in the database).
        if self.snooze_first && !SNOOZED.swap(true, Ordering::SeqCst) {
            return Err(JobError::snooze(Duration::from_secs(3600), "quiet hours"));
        }
        Ok(())
    }
}

/// Exports a tenant's data, in long mode: it holds its group without an
/// open transaction, and what it writes commits as it goes. Its first
/// attempt fails after writing a row.
#[derive(Job, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[job(queue = "exports", long, max_attempts = 2)]
pub struct Export {
    /// Which export.
    pub name: String,
}

#[async_trait]
impl Handler for Export {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let attempt = ctx.attempt();
        pgfifo::diesel::sql_query("INSERT INTO export_step (name, attempt) VALUES ($1, $2)")
            .bind::<Text, _>(&self.name)
            .bind::<pgfifo::diesel::sql_types::Integer, _>(attempt as i32)
            .execute(ctx.conn())
            .await?;
        if attempt == 1 {
            return Err(JobError::retry("the export target is down"));
        }
        Ok(())
    }
}

//! The dashboard's pages, one module each, and what they share: where the
//! dashboard is mounted, the browser's CSRF token, a connection.

pub(crate) mod batches;
pub(crate) mod failed;
pub(crate) mod group;
pub(crate) mod groups;
pub(crate) mod job;
pub(crate) mod overview;

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use maud::Markup;

use super::base::Base;
use super::fail::Fail;
use super::html::{layout, ActionForm};
use super::security::CsrfToken;
use super::Shared;
use crate::admin::{GroupInfo, GroupState, QueueUsage, QueueWait};
use crate::db::PooledConnection;

/// What a page handler works with.
pub(crate) struct Ctx {
    /// The path the dashboard is mounted at (`""` at the root).
    pub base: String,
    pub token: String,
    pub read_only: bool,
}

impl FromRequestParts<Arc<Shared>> for Ctx {
    type Rejection = Fail;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<Shared>) -> Result<Ctx, Fail> {
        let base = parts
            .extensions
            .get::<Base>()
            .map(|b| b.0.clone())
            .unwrap_or_default();
        let token = parts
            .extensions
            .get::<CsrfToken>()
            .map(|t| t.value.clone())
            .unwrap_or_default();
        Ok(Ctx {
            base,
            token,
            read_only: state.read_only,
        })
    }
}

impl Ctx {
    /// The page frame with this context's base.
    pub(crate) fn page(&self, title: &str, body: Markup) -> Markup {
        layout(&self.base, title, body)
    }

    /// The action buttons' helper.
    pub(crate) fn actions(&self) -> ActionForm<'_> {
        ActionForm {
            base: &self.base,
            token: &self.token,
            read_only: self.read_only,
        }
    }
}

/// A pooled connection, or a 503 page.
pub(crate) async fn conn(shared: &Arc<Shared>) -> Result<PooledConnection, Fail> {
    Ok(shared.pool.get_owned().await?)
}

/// Any other path.
pub(crate) async fn not_found() -> Fail {
    Fail::not_found("no such page")
}

/// One line on why a group is where it is, and what would move it.
pub(crate) fn reason(g: &GroupInfo) -> String {
    let head = g
        .head
        .map_or_else(String::new, |id| format!("head job {id}"));
    let attempts = match (g.head_attempts, g.head_max_attempts) {
        (Some(a), Some(m)) => format!("{a}/{m} attempts"),
        _ => String::new(),
    };
    let error = g
        .head_error
        .as_deref()
        .map(|e| format!(": {}", first_line(e)))
        .unwrap_or_default();
    match g.state {
        GroupState::Idle => "no job waiting".to_owned(),
        GroupState::Ready => match g.queue_wait {
            Some(wait) => format!("{head} is ready, {}", queue_wait(wait)),
            None => format!("{head} is ready and waits for a free runner slot"),
        },
        GroupState::Running => format!("{head} is running ({attempts} so far)"),
        GroupState::Scheduled => match g.waiting_until {
            Some(t) => format!("{head} is scheduled: starts in {}", super::html::ago(super::html::until(t))),
            None => format!("{head} is scheduled"),
        },
        GroupState::Waiting => match &g.dependency_wait {
            Some(wait) => format!("{head}: {wait}"),
            None => format!("{head} waits for its dependencies"),
        },
        GroupState::Retrying => match g.waiting_until {
            Some(t) => format!(
                "{head} failed {attempts}, next try in {}{error}",
                super::html::ago(super::html::until(t))
            ),
            None => format!("{head} failed {attempts} and waits for its retry{error}"),
        },
        GroupState::Held => format!(
            "{head} failed for good ({attempts}), policy hold: retry or skip it to release the group{error}"
        ),
        GroupState::Paused => "paused by an operator: resume it to go on".to_owned(),
        GroupState::Snoozed => match g.snoozed_until {
            Some(t) => format!(
                "snoozed until {}, by {head} (in {}; no attempt used)",
                super::html::at(t),
                super::html::ago(super::html::until(t))
            ),
            None => format!("snoozed by {head}"),
        },
        GroupState::RateLimited => {
            let rate = g
                .rate
                .map(|r| format!(" ({r}, burst {})", g.burst.unwrap_or(r.count())));
            match g.waiting_until {
                Some(t) => format!(
                    "rate-limited{}: {head} starts with the next token, in {}",
                    rate.unwrap_or_default(),
                    super::html::ago(super::html::until(t))
                ),
                None => format!("rate-limited{}", rate.unwrap_or_default()),
            }
        }
    }
}

/// Why a ready head waits for its queue, with when its next token is due.
pub(crate) fn queue_wait(wait: QueueWait) -> String {
    match wait {
        QueueWait::Rate {
            next_token_at: Some(t),
            ..
        } => format!(
            "{wait}: the next is due in {}",
            super::html::ago(super::html::until(t))
        ),
        _ => wait.to_string(),
    }
}

/// A queue's limits and what they hold back now: `20 at once, 20 running
/// now (at its limit) · 100/m, burst 10, 0.4 tokens now`.
pub(crate) fn queue_usage(usage: &QueueUsage) -> String {
    let mut parts = Vec::new();
    if let Some(n) = usage.limits.concurrency {
        let full = if usage.at_limit {
            " (at its limit)"
        } else {
            ""
        };
        parts.push(format!(
            "{n} at once, {} running now{full}",
            usage.running.unwrap_or(0)
        ));
    }
    if let Some(rate) = usage.limits.rate {
        parts.push(format!(
            "{rate}, burst {}, {:.1} tokens now",
            usage.limits.burst.unwrap_or(rate.count()),
            usage.tokens.unwrap_or(0.0).max(0.0)
        ));
    }
    parts.join(" · ")
}

/// The first line of `text`, cut at 160 characters.
pub(crate) fn first_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or("");
    if line.chars().count() > 160 {
        let cut: String = line.chars().take(160).collect();
        format!("{cut}…")
    } else {
        line.to_owned()
    }
}

//! A web dashboard: every queue and group at a glance, why each one waits,
//! and the actions that unblock it. (Cargo feature `dashboard`.)
//!
//! [`router`] returns an [axum](https://docs.rs/axum) router to mount in an
//! application, behind its own authentication:
//!
//! ```no_run
//! # async fn run(pool: pgfifo::Pool) -> std::io::Result<()> {
//! let app = axum::Router::new().nest("/jobs", pgfifo::dashboard::router(pool));
//! # let _ = app;
//! # Ok(())
//! # }
//! ```
//!
//! `pgfifo dashboard` serves the same router on its own, on 127.0.0.1 by
//! default ([`serve`]).
//!
//! Pages are rendered on the server (maud, which escapes every value it
//! writes: payloads, group names and error messages are user data) and
//! refresh themselves with a few lines of plain JavaScript; the stylesheet
//! and the script are compiled into the binary. Everything a page shows
//! comes from [`crate::admin`], so the dashboard, the CLI and the API mean
//! the same thing by each figure and each action.
//!
//! **Actions** (retry, cancel, skip a head, pause or resume a group or a
//! queue) are `POST` forms, each confirmed in the browser, and protected
//! against cross-site requests: the form carries a token that must match
//! the dashboard's cookie (`SameSite=Strict`), and a request whose `Origin`
//! is not the dashboard's own is refused. An action that loses a race (the
//! job already ran, the head is running) changes nothing and says why.
//! [`DashboardConfig::read_only`] hides the actions and refuses them.
//!
//! No SQL is built from request text: parameters are parsed into typed
//! values (a bad one is a 400) and reach the admin functions, which bind
//! them.

mod actions;
mod base;
mod chart;
mod fail;
mod html;
mod pages;
mod security;
mod serve;

use std::sync::Arc;

use axum::routing::{get, post};
use axum::Router;

use crate::db::Pool;

pub use security::Access;
pub use serve::{serve, ServeError};

/// How the dashboard behaves.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct DashboardConfig {
    /// Show no actions and refuse every `POST` (403).
    pub read_only: bool,
}

impl DashboardConfig {
    /// Sets [`read_only`](Self::read_only).
    pub fn read_only(mut self, yes: bool) -> Self {
        self.read_only = yes;
        self
    }
}

/// What every handler shares.
pub(crate) struct Shared {
    pub pool: Pool,
    pub read_only: bool,
}

/// The dashboard with actions enabled, for mounting (`Router::nest`) behind
/// the application's own authentication.
pub fn router(pool: Pool) -> Router {
    router_with(pool, DashboardConfig::default())
}

/// The dashboard as `config` says.
pub fn router_with(pool: Pool, config: DashboardConfig) -> Router {
    let shared = Arc::new(Shared {
        pool,
        read_only: config.read_only,
    });
    Router::new()
        .route("/", get(pages::overview::page))
        .route("/queues/{queue}", get(pages::groups::page))
        .route("/queues/{queue}/failed", get(pages::failed::page))
        .route("/queues/{queue}/groups/{group}", get(pages::group::page))
        .route("/jobs/{id}", get(pages::job::page))
        .route("/batches", get(pages::batches::list))
        .route("/batches/{id}", get(pages::batches::page))
        .route("/assets/dashboard.css", get(html::stylesheet))
        .route("/assets/dashboard.js", get(html::script))
        .route("/actions/{action}", post(actions::act))
        .fallback(pages::not_found)
        .layer(axum::middleware::from_fn(security::csrf_cookie))
        .layer(axum::middleware::from_fn(with_base))
        .with_state(shared)
}

/// Middleware: works out the request's prefix (`base`; 400 if it is not
/// plain) and keeps it for the pages of this request.
async fn with_base(
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let original = request.extensions().get::<axum::extract::OriginalUri>();
    let Some(prefix) = base::base_of(request.uri(), original) else {
        return fail::Fail::bad_request(
            "the dashboard's mount path has characters it cannot link to",
        )
        .into_response();
    };
    request.extensions_mut().insert(base::Base(prefix.clone()));
    base::scope(prefix, next.run(request)).await
}

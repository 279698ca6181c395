//! Serving the dashboard on its own (`pgfifo dashboard`).

use std::net::SocketAddr;

use super::{router_with, Access, DashboardConfig};
use crate::db::Pool;

/// Why [`serve`] did not serve.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address is reachable from other machines and nothing protects
    /// the dashboard.
    #[error(
        "refusing to serve the dashboard on {0} without credentials: it is reachable from other \
         machines. Give a token (--token) or basic-auth credentials (--basic-auth USER:PASSWORD), \
         serve it read-only (--read-only), or listen on 127.0.0.1"
    )]
    Exposed(SocketAddr),
    /// The address could not be bound or served.
    #[error("could not serve the dashboard on {0}: {1}")]
    Io(SocketAddr, #[source] std::io::Error),
}

/// Checks that serving on `addr` with `access` is safe: loopback, or
/// credentials, or read-only.
pub(crate) fn check_exposure(
    addr: SocketAddr,
    access: &Access,
    config: &DashboardConfig,
) -> Result<(), ServeError> {
    if addr.ip().is_loopback() || *access != Access::Open || config.read_only {
        Ok(())
    } else {
        Err(ServeError::Exposed(addr))
    }
}

/// Serves the dashboard on `addr` until `shutdown` completes. Refuses an
/// address other machines can reach unless `access` asks for credentials or
/// the dashboard is read-only. Open on a loopback address, it answers only
/// requests whose `Host` is `127.0.0.1`, `localhost` or `[::1]` on its port
/// (against DNS rebinding). Calls `ready` with the bound address (useful
/// with port 0) before it serves.
pub async fn serve(
    pool: Pool,
    addr: SocketAddr,
    config: DashboardConfig,
    access: Access,
    ready: impl FnOnce(SocketAddr),
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    check_exposure(addr, &access, &config)?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| ServeError::Io(addr, e))?;
    let bound = listener.local_addr().map_err(|e| ServeError::Io(addr, e))?;
    let open_loopback = access == Access::Open && bound.ip().is_loopback();
    let mut app =
        router_with(pool, config).layer(axum::middleware::from_fn(move |request, next| {
            access.clone().require(request, next)
        }));
    if open_loopback {
        let port = bound.port();
        app = app.layer(axum::middleware::from_fn(move |request, next| {
            super::security::loopback_host_only(port, request, next)
        }));
    }
    ready(bound);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| ServeError::Io(bound, e))
}

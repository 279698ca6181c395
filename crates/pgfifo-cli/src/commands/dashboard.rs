//! `pgfifo dashboard`: serves the web dashboard until Ctrl-C or SIGTERM.

use std::net::SocketAddr;

use clap::Args;
use pgfifo::dashboard::{self, Access, DashboardConfig};

use crate::error::{CliError, CliResult};

/// Connections the dashboard's pool keeps (pages take one each, briefly).
const POOL_SIZE: u32 = 4;

/// `pgfifo dashboard`'s options.
#[derive(Debug, Args)]
pub struct DashboardArgs {
    /// Where to listen. Anything but a loopback address needs --token,
    /// --basic-auth or --read-only.
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR:PORT")]
    listen: SocketAddr,
    /// Show no actions and refuse them.
    #[arg(long)]
    read_only: bool,
    /// Require this token: `Authorization: Bearer TOKEN`, or basic auth with
    /// it as the password.
    #[arg(
        long,
        env = "PGFIFO_DASHBOARD_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    token: Option<String>,
    /// Require basic auth with these credentials.
    #[arg(
        long,
        env = "PGFIFO_DASHBOARD_BASIC_AUTH",
        hide_env_values = true,
        value_name = "USER:PASSWORD",
        conflicts_with = "token"
    )]
    basic_auth: Option<String>,
}

impl DashboardArgs {
    fn access(&self) -> CliResult<Access> {
        match (&self.token, &self.basic_auth) {
            (Some(token), _) if token.is_empty() => {
                Err(CliError::usage("--token must not be empty"))
            }
            (Some(token), _) => Ok(Access::Token(token.clone())),
            (None, Some(pair)) => match pair.split_once(':') {
                Some((user, password)) if !user.is_empty() && !password.is_empty() => {
                    Ok(Access::Basic {
                        user: user.to_owned(),
                        password: password.to_owned(),
                    })
                }
                _ => Err(CliError::usage(
                    "--basic-auth takes USER:PASSWORD, both non-empty",
                )),
            },
            (None, None) => Ok(Access::Open),
        }
    }
}

/// Serves the dashboard on a pool of its own.
pub async fn serve(url: &str, transaction_pooler: bool, args: DashboardArgs) -> CliResult {
    let access = args.access()?;
    let config = DashboardConfig::default().read_only(args.read_only);
    let options = pgfifo::ConnectOptions::new(POOL_SIZE).transaction_pooler(transaction_pooler);
    let pool = pgfifo::connect_with(url, options)
        .await
        .map_err(|err| CliError::failure(format!("cannot connect to the database: {err}")))?;
    let mode = if args.read_only { " (read-only)" } else { "" };
    dashboard::serve(
        pool,
        args.listen,
        config,
        access,
        |addr| eprintln!("pgfifo dashboard{mode} on http://{addr}/ (Ctrl-C stops it)"),
        shutdown_signal(),
    )
    .await
    .map_err(|err| match err {
        dashboard::ServeError::Exposed(_) => CliError::usage(err.to_string()),
        dashboard::ServeError::Io(..) => CliError::failure(err.to_string()),
    })
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

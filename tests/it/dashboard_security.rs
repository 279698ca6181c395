//! The dashboard's defences over HTTP: cross-site requests, read-only mode,
//! credentials, and the refusal to serve on a public address without them.

use std::time::Duration;

use axum::http::StatusCode;
use pgfifo::admin::{self, GroupState};
use pgfifo::dashboard::{self, Access, DashboardConfig, ServeError};

use crate::admin_support::{Fx, Mode, QUEUE};
use crate::dashboard_support::Client;

async fn fixture() -> Fx {
    let fx = Fx::new().await;
    fx.push("g", 1, Mode::Ok).await;
    fx
}

async fn paused(fx: &Fx) -> bool {
    let mut conn = fx.conn().await;
    let info = admin::group(&mut conn, QUEUE, "g").await.unwrap().unwrap();
    info.state == GroupState::Paused
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_without_the_pages_token_or_from_elsewhere_are_refused() {
    let fx = fixture().await;
    let mut client = Client::new(dashboard::router(fx.pool.clone()));
    let form = format!("queue={QUEUE}&group=g");

    // No cookie at all (a first request from another site's form).
    let bare = client.post("/actions/pause-group", &form, &[]).await;
    assert_eq!(bare.status, StatusCode::FORBIDDEN, "{}", bare.body);

    client.get("/").await;
    let token = client.token();
    // The cookie, but no token in the form.
    let missing = client.post("/actions/pause-group", &form, &[]).await;
    assert_eq!(missing.status, StatusCode::FORBIDDEN);
    // A wrong token.
    let wrong = format!("csrf={}&{form}", "0".repeat(64));
    assert_eq!(
        client
            .post("/actions/pause-group", &wrong, &[])
            .await
            .status,
        StatusCode::FORBIDDEN
    );
    // The right token from another origin, or a cross-site fetch.
    let right = format!("csrf={token}&{form}");
    let evil = client
        .post(
            "/actions/pause-group",
            &right,
            &[("origin", "http://evil.example")],
        )
        .await;
    assert_eq!(evil.status, StatusCode::FORBIDDEN);
    let cross = client
        .post(
            "/actions/pause-group",
            &right,
            &[("sec-fetch-site", "cross-site")],
        )
        .await;
    assert_eq!(cross.status, StatusCode::FORBIDDEN);
    assert!(!paused(&fx).await, "nothing changed");

    // From the dashboard's own page: done.
    let own = client
        .post(
            "/actions/pause-group",
            &right,
            &[
                ("origin", "http://127.0.0.1:8080"),
                ("sec-fetch-site", "same-origin"),
            ],
        )
        .await;
    assert_eq!(own.status, StatusCode::SEE_OTHER, "{}", own.body);
    assert!(paused(&fx).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_hides_and_refuses_actions() {
    let fx = fixture().await;
    let config = DashboardConfig::default().read_only(true);
    let mut client = Client::new(dashboard::router_with(fx.pool.clone(), config));
    for path in [
        "/".to_owned(),
        format!("/queues/{QUEUE}/groups/g"),
        format!("/queues/{QUEUE}/failed"),
    ] {
        let page = client.get(&path).await;
        assert_eq!(page.status, StatusCode::OK);
        assert!(
            !page.body.contains("method=\"post\""),
            "{path} shows a form: {}",
            page.body
        );
    }
    let refused = client
        .act("pause-group", &format!("queue={QUEUE}&group=g"))
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert!(refused.body.contains("read-only"));
    assert!(!paused(&fx).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serving_publicly_needs_credentials_or_read_only() {
    let fx = fixture().await;
    let public = "0.0.0.0:0".parse().unwrap();
    let refused = dashboard::serve(
        fx.pool.clone(),
        public,
        DashboardConfig::default(),
        Access::Open,
        |_| panic!("it must not listen"),
        async {},
    )
    .await;
    assert!(
        matches!(refused, Err(ServeError::Exposed(_))),
        "{refused:?}"
    );
    assert!(refused.unwrap_err().to_string().contains("--token"));

    // With a token it serves, and asks for it.
    let server = Served::start(
        &fx,
        DashboardConfig::default(),
        Access::Token("s3cret".into()),
    )
    .await;
    assert_eq!(http_status(&server.url, None).await, 401);
    assert_eq!(http_status(&server.url, Some("Bearer nope")).await, 401);
    assert_eq!(http_status(&server.url, Some("Bearer s3cret")).await, 200);
    server.stop().await;

    // Read-only needs nothing.
    let server = Served::start(
        &fx,
        DashboardConfig::default().read_only(true),
        Access::Open,
    )
    .await;
    assert_eq!(http_status(&server.url, None).await, 200);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_loopback_dashboard_answers_only_to_loopback_names() {
    let fx = fixture().await;
    let server =
        Served::start_on(&fx, "127.0.0.1:0", DashboardConfig::default(), Access::Open).await;
    let port = server
        .url
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .unwrap()
        .to_owned();
    assert_eq!(http_status(&server.url, None).await, 200);
    assert_eq!(
        http_status_as(&server.url, &format!("localhost:{port}"), None).await,
        200
    );
    // A page of another site whose name now points at 127.0.0.1 (DNS
    // rebinding) is not answered, nor is another port's name.
    assert_eq!(
        http_status_as(&server.url, &format!("attacker.example:{port}"), None).await,
        421
    );
    assert_eq!(http_status_as(&server.url, "127.0.0.1:1", None).await, 421);
    server.stop().await;
}

/// `dashboard::serve` on 0.0.0.0 and a free port, until stopped.
struct Served {
    url: String,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), ServeError>>,
}

impl Served {
    async fn start(fx: &Fx, config: DashboardConfig, access: Access) -> Served {
        Self::start_on(fx, "0.0.0.0:0", config, access).await
    }

    async fn start_on(fx: &Fx, addr: &str, config: DashboardConfig, access: Access) -> Served {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(dashboard::serve(
            fx.pool.clone(),
            addr.parse().unwrap(),
            config,
            access,
            move |addr| tx.send(addr).unwrap(),
            async move {
                let _ = stopped.await;
            },
        ));
        let addr: std::net::SocketAddr = tokio::time::timeout(Duration::from_secs(10), rx)
            .await
            .unwrap()
            .unwrap();
        Served {
            url: format!("http://127.0.0.1:{}/", addr.port()),
            stop,
            task,
        }
    }

    async fn stop(self) {
        self.stop.send(()).unwrap();
        self.task.await.unwrap().unwrap();
    }
}

/// The status of `GET url` over a real socket (HTTP/1.1 by hand).
async fn http_status(url: &str, authorization: Option<&str>) -> u16 {
    let host = url
        .strip_prefix("http://")
        .unwrap()
        .split('/')
        .next()
        .unwrap();
    http_status_as(url, host, authorization).await
}

/// [`http_status`] with `host` as the `Host` header.
async fn http_status_as(url: &str, host_header: &str, authorization: Option<&str>) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
    let host = host_header;
    let auth = authorization.map_or_else(String::new, |a| format!("Authorization: {a}\r\n"));
    let request =
        format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response.split(' ').nth(1).unwrap().parse().unwrap()
}

//! A headless Chromium for tests that drive a real browser against an HTTP
//! server they start themselves.
//!
//! [`Browser::start`] spawns `chromedriver` on a free loopback port and opens
//! a WebDriver session on headless Chromium (1280x900, no GPU, no sandbox).
//! When `chromedriver` or Chromium is not installed it prints what to install
//! and returns `None`, so the test can return early; with
//! `PGFIFO_REQUIRE_BROWSER=1` (meant for CI) it panics instead.
//!
//! On Debian: `apt-get install -y chromium chromium-driver`. The binaries are
//! looked up on `PATH` (`chromedriver`; `chromium`, `chromium-browser`,
//! `google-chrome`), or taken from `PGFIFO_CHROMEDRIVER` and
//! `PGFIFO_CHROMIUM`.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

/// The size of the page's viewport in CSS pixels (at a device scale factor of
/// 1), fixed so that screenshots are stable: they are this many pixels.
pub const WINDOW_SIZE: (u32, u32) = (1280, 900);

/// How often the harness polls (chromedriver's readiness, the DOM, alerts).
const POLL: Duration = Duration::from_millis(50);

/// How long `chromedriver` may take to answer `/status` as ready.
const DRIVER_DEADLINE: Duration = Duration::from_secs(20);

/// How long opening the WebDriver session (starting Chromium) may take.
const SESSION_DEADLINE: Duration = Duration::from_secs(60);

/// What to install, said when the browser is missing.
const INSTALL_HINT: &str = "apt-get install -y chromium chromium-driver";

/// A headless Chromium driven through a `chromedriver` of its own.
///
/// Dropping it ends the WebDriver session (which closes Chromium) and kills
/// `chromedriver`; [`close`](Self::close) does the same, awaited.
pub struct Browser {
    client: Client,
    session_id: Option<String>,
    // Dropped after the client: kills chromedriver.
    driver: Driver,
}

/// A running `chromedriver`, killed (and its log file removed) on drop, so
/// also when opening the session fails.
struct Driver {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

impl Browser {
    /// Starts `chromedriver` and a headless Chromium session.
    ///
    /// Returns `None`, after one line on stderr saying what to install, when
    /// either binary is missing, unless `PGFIFO_REQUIRE_BROWSER=1`, in which
    /// case it panics with that line. Panics when they are installed but do
    /// not start.
    pub async fn start() -> Option<Browser> {
        let (driver_bin, chromium_bin) = match find_binaries() {
            Ok(found) => found,
            Err(missing) => {
                let missing = format!("{missing} not found; install it with `{INSTALL_HINT}`");
                if std::env::var("PGFIFO_REQUIRE_BROWSER").as_deref() == Ok("1") {
                    panic!("browser test failed (PGFIFO_REQUIRE_BROWSER=1): {missing}");
                }
                eprintln!(
                    "browser test skipped: {missing} (PGFIFO_REQUIRE_BROWSER=1 makes this a failure)"
                );
                return None;
            }
        };
        let driver = spawn_driver(&driver_bin).await;
        let mut browser = Browser {
            client: connect(&driver, &chromium_bin).await,
            session_id: None,
            driver,
        };
        browser.session_id = browser
            .client
            .session_id()
            .await
            .expect("WebDriver session id");
        browser.fit_viewport().await;
        Some(browser)
    }

    /// The WebDriver client, for everything the helpers here do not cover.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Opens `url`; panics if it cannot be loaded.
    pub async fn goto(&self, url: &str) {
        self.client
            .goto(url)
            .await
            .unwrap_or_else(|e| panic!("open {url}: {e}"));
    }

    /// The first element matching the CSS `selector`; panics if there is none.
    pub async fn find(&self, selector: &str) -> Element {
        self.client
            .find(Locator::Css(selector))
            .await
            .unwrap_or_else(|e| panic!("find `{selector}`: {e}"))
    }

    /// The rendered text of the first element matching the CSS `selector`;
    /// panics if there is none.
    pub async fn text_of(&self, selector: &str) -> String {
        self.find(selector)
            .await
            .text()
            .await
            .unwrap_or_else(|e| panic!("text of `{selector}`: {e}"))
    }

    /// Clicks the first element matching the CSS `selector`; panics if there
    /// is none or it cannot be clicked.
    pub async fn click(&self, selector: &str) {
        self.find(selector)
            .await
            .click()
            .await
            .unwrap_or_else(|e| panic!("click `{selector}`: {e}"));
    }

    /// Waits until an element matching the CSS `selector` has rendered text
    /// containing `text`, polling the DOM every 50 ms, and returns it. After
    /// `timeout`, panics with what those elements showed and an excerpt of
    /// the page source.
    pub async fn wait_for_text(&self, selector: &str, text: &str, timeout: Duration) -> Element {
        let deadline = Instant::now() + timeout;
        loop {
            let mut seen = Vec::new();
            match self.client.find_all(Locator::Css(selector)).await {
                Ok(elements) => {
                    for element in elements {
                        match element.text().await {
                            Ok(shown) if shown.contains(text) => return element,
                            Ok(shown) => seen.push(shown),
                            Err(e) => seen.push(format!("<{e}>")),
                        }
                    }
                }
                Err(e) => seen.push(format!("<{e}>")),
            }
            if Instant::now() > deadline {
                panic!(
                    "waited {timeout:?} for `{selector}` to contain {text:?}; \
                     it showed {seen:?}\npage source (excerpt):\n{}",
                    self.source_excerpt().await
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits up to `timeout` for an alert, confirm or prompt dialog, accepts
    /// it (OK) and returns its text; panics if none opens in time.
    pub async fn accept_alert(&self, timeout: Duration) -> String {
        let text = self.alert_text(timeout).await;
        self.client
            .accept_alert()
            .await
            .unwrap_or_else(|e| panic!("accept the dialog {text:?}: {e}"));
        text
    }

    /// Like [`accept_alert`](Self::accept_alert), but dismisses the dialog
    /// (Cancel).
    pub async fn dismiss_alert(&self, timeout: Duration) -> String {
        let text = self.alert_text(timeout).await;
        self.client
            .dismiss_alert()
            .await
            .unwrap_or_else(|e| panic!("dismiss the dialog {text:?}: {e}"));
        text
    }

    /// Takes a screenshot of the window and writes it to `path` as a PNG,
    /// creating its parent directories.
    pub async fn screenshot_to(&self, path: &Path) {
        let png = self.client.screenshot().await.expect("take a screenshot");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        }
        std::fs::write(path, png).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    /// Ends the WebDriver session (closing Chromium) and kills `chromedriver`.
    pub async fn close(mut self) {
        if self.client.clone().close().await.is_ok() {
            self.session_id = None;
        }
        // Drop kills chromedriver (and deletes the session if closing failed).
    }

    /// Resizes the window so that the page's viewport (what screenshots
    /// show) is [`WINDOW_SIZE`]: headless Chromium keeps room for window
    /// decorations out of `--window-size`.
    async fn fit_viewport(&self) {
        let (width, height) = WINDOW_SIZE;
        let frame = self
            .client
            .execute(
                "return [window.outerWidth - window.innerWidth, \
                         window.outerHeight - window.innerHeight];",
                Vec::new(),
            )
            .await
            .expect("measure the window frame");
        let frame = |i: usize| frame[i].as_u64().unwrap_or(0) as u32;
        self.client
            .set_window_size(width + frame(0), height + frame(1))
            .await
            .expect("resize the window");
    }

    async fn alert_text(&self, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            match self.client.get_alert_text().await {
                Ok(text) => return text,
                Err(e) if Instant::now() > deadline => {
                    panic!("waited {timeout:?} for a dialog; last: {e}")
                }
                Err(_) => tokio::time::sleep(POLL).await,
            }
        }
    }

    /// The start of the page source (or why it could not be had).
    async fn source_excerpt(&self) -> String {
        match self.client.source().await {
            Ok(source) => excerpt(&source, 2000),
            Err(e) => format!("<no page source: {e}>"),
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Synchronously, so it works on any runtime and while panicking:
        // chromedriver closes Chromium when its session is deleted.
        if let Some(id) = self.session_id.take() {
            delete_session(self.driver.port, &id);
        }
        // Then `driver`'s drop kills chromedriver.
    }
}

/// The chromedriver and Chromium binaries, or the name of what is missing.
fn find_binaries() -> Result<(PathBuf, PathBuf), &'static str> {
    let driver = from_env_or_path("PGFIFO_CHROMEDRIVER", &["chromedriver"]);
    let chromium = from_env_or_path(
        "PGFIFO_CHROMIUM",
        &["chromium", "chromium-browser", "google-chrome"],
    );
    match (driver, chromium) {
        (Some(driver), Some(chromium)) => Ok((driver, chromium)),
        (None, Some(_)) => Err("chromedriver"),
        (Some(_), None) => Err("chromium"),
        (None, None) => Err("chromedriver and chromium"),
    }
}

/// `$var` if set to an existing file, else the first of `names` on `PATH`.
fn from_env_or_path(var: &str, names: &[&str]) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(var) {
        let path = PathBuf::from(path);
        return path.is_file().then_some(path);
    }
    let dirs = std::env::var_os("PATH")?;
    names.iter().find_map(|name| {
        std::env::split_paths(&dirs)
            .map(|dir| dir.join(name))
            .find(|path| path.is_file())
    })
}

impl Driver {
    /// The start of what chromedriver printed, for failure messages.
    fn output(&self) -> String {
        excerpt(
            &std::fs::read_to_string(&self.log).unwrap_or_default(),
            2000,
        )
    }
}

/// Spawns `chromedriver` on a free loopback port (retrying on another port
/// if it exits at once, as when another process took the port meanwhile) and
/// waits until `/status` says it is ready.
async fn spawn_driver(bin: &Path) -> Driver {
    let mut last_failure = String::new();
    for _ in 0..3 {
        let port = free_port();
        let log = std::env::temp_dir().join(format!(
            "pgfifo-chromedriver-{}-{port}.log",
            std::process::id()
        ));
        let log_file =
            std::fs::File::create(&log).unwrap_or_else(|e| panic!("create {}: {e}", log.display()));
        let child = Command::new(bin)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("clone the log file"))
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        let mut driver = Driver { child, port, log };
        match wait_ready(&mut driver).await {
            Ok(()) => return driver,
            Err(why) => {
                let output = driver.output();
                last_failure = format!("{why}; its output:\n{output}");
            }
        }
    }
    panic!("{} did not start: {last_failure}", bin.display());
}

/// A loopback port that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .expect("bind a free loopback port")
        .port()
}

/// Polls chromedriver's `/status` every 50 ms until it says it is ready.
async fn wait_ready(driver: &mut Driver) -> Result<(), String> {
    let deadline = Instant::now() + DRIVER_DEADLINE;
    loop {
        if let Some(status) = driver.child.try_wait().map_err(|e| e.to_string())? {
            return Err(format!("chromedriver exited ({status})"));
        }
        let last = match status(driver.port).await {
            Ok(true) => return Ok(()),
            Ok(false) => "/status says not ready".to_owned(),
            Err(e) => e,
        };
        if Instant::now() > deadline {
            return Err(format!(
                "chromedriver not ready after {DRIVER_DEADLINE:?} ({last})"
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Whether chromedriver on `port` answers `GET /status` with `ready: true`.
async fn status(port: u16) -> Result<bool, String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await?;
        stream
            .write_all(
                format!(
                    "GET /status HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
                )
                .as_bytes(),
            )
            .await?;
        // chromedriver keeps the connection open: read up to Content-Length.
        let mut response = Vec::new();
        let mut buf = [0u8; 4096];
        while response_body(&response).is_none() {
            match stream.read(&mut buf).await? {
                0 => break,
                n => response.extend_from_slice(&buf[..n]),
            }
        }
        std::io::Result::Ok(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .map_err(|_| "/status timed out".to_owned())?
        .map_err(|e| format!("/status: {e}"))?;
    let body = response_body(&response)
        .ok_or_else(|| format!("/status answered {:?}", String::from_utf8_lossy(&response)))?;
    let json: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| format!("/status body {:?}: {e}", String::from_utf8_lossy(body)))?;
    Ok(json["value"]["ready"] == serde_json::Value::Bool(true))
}

/// The body of the HTTP response in `response` once all of it (per its
/// `Content-Length`) has arrived.
fn response_body(response: &[u8]) -> Option<&[u8]> {
    let end = response.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&response[..end]);
    let length = head
        .lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, value)| value.trim().parse::<usize>().ok())?;
    response[end + 4..].get(..length)
}

/// Opens a WebDriver session on headless Chromium through chromedriver.
async fn connect(driver: &Driver, chromium: &Path) -> Client {
    let (width, height) = WINDOW_SIZE;
    let capabilities = serde_json::json!({
        "browserName": "chrome",
        // Leave dialogs open when a command meets one, for accept_alert.
        "unhandledPromptBehavior": "ignore",
        "goog:chromeOptions": {
            "binary": chromium.to_string_lossy(),
            "args": [
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                format!("--window-size={width},{height}"),
                "--force-device-scale-factor=1",
                "--hide-scrollbars",
                "--no-first-run",
                "--no-default-browser-check",
            ],
        },
    });
    let serde_json::Value::Object(capabilities) = capabilities else {
        unreachable!("capabilities are an object")
    };
    let url = format!("http://127.0.0.1:{}", driver.port);
    let mut builder = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new());
    builder.capabilities(capabilities);
    let connecting = builder.connect(&url);
    match tokio::time::timeout(SESSION_DEADLINE, connecting).await {
        Ok(Ok(client)) => client,
        outcome => {
            let why = match outcome {
                Ok(Err(e)) => e.to_string(),
                _ => format!("no session after {SESSION_DEADLINE:?}"),
            };
            panic!(
                "start headless {} through chromedriver: {why}; chromedriver's output:\n{}",
                chromium.display(),
                driver.output()
            );
        }
    }
}

/// Deletes WebDriver session `id` on chromedriver at `port`, blocking for a
/// few seconds at most; errors are ignored (chromedriver is killed next).
fn delete_session(port: u16, id: &str) {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
        return;
    };
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let request = format!(
        "DELETE /session/{id} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    if stream.write_all(request.as_bytes()).is_err() {
        return;
    }
    // Wait for the answer (Chromium has quit by then), not for the close.
    let mut response = Vec::new();
    let mut buf = [0u8; 4096];
    while response_body(&response).is_none() {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => response.extend_from_slice(&buf[..n]),
        }
    }
}

/// The first `max` characters of `text`, marked when cut.
fn excerpt(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

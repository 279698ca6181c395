//! The headless-browser harness end to end: a page served by the test, DOM
//! text, a click, a confirm dialog, a screenshot.

use std::time::Duration;

use pgfifo_tests::browser::{Browser, WINDOW_SIZE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const PAGE: &str = r#"<!doctype html>
<html>
<head><meta charset="utf-8"><title>browser smoke</title></head>
<body>
  <h1 id="title">pgfifo browser smoke</h1>
  <form id="form" onsubmit="event.preventDefault();
      if (confirm('Send it?')) { document.getElementById('msg').textContent = 'Sent!'; }">
    <button id="send" type="submit">Send</button>
  </form>
  <p id="msg">Not sent yet</p>
</body>
</html>
"#;

/// Serves `PAGE` for every request on a free loopback port; returns its URL.
async fn serve_page() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local address");
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                // Read the request head (browsers send no body with GET).
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{PAGE}",
                    PAGE.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    format!("http://{addr}/")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_clicks_confirms_and_screenshots() {
    let Some(browser) = Browser::start().await else {
        return; // Browser::start said what to install.
    };
    let url = serve_page().await;
    browser.goto(&url).await;

    assert_eq!(browser.text_of("#title").await, "pgfifo browser smoke");
    assert_eq!(browser.text_of("#msg").await, "Not sent yet");

    browser.click("#send").await;
    let asked = browser.accept_alert(Duration::from_secs(5)).await;
    assert_eq!(asked, "Send it?");
    browser
        .wait_for_text("#msg", "Sent!", Duration::from_secs(5))
        .await;

    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("browser_smoke-{}", std::process::id()));
    let shot = dir.join("page.png");
    browser.screenshot_to(&shot).await;
    let png = std::fs::read(&shot).expect("read the screenshot");
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "{} is not a PNG ({} bytes)",
        shot.display(),
        png.len()
    );
    // IHDR: width and height, big-endian, at bytes 16..24.
    let size = |at: usize| u32::from_be_bytes(png[at..at + 4].try_into().unwrap());
    assert!(png.len() > 24, "{} is truncated", shot.display());
    assert_eq!((size(16), size(20)), WINDOW_SIZE, "screenshot size");

    browser.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}

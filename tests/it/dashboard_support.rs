//! What the dashboard tests share: requests against the router (no socket),
//! with the browser's cookie carried from page to action.

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use tower::ServiceExt;

/// One answer of the dashboard.
pub(crate) struct Answer {
    pub status: StatusCode,
    pub location: Option<String>,
    pub set_cookie: Option<String>,
    pub body: String,
}

/// A browser as far as the dashboard can tell: its CSRF cookie.
pub(crate) struct Client {
    pub app: Router,
    pub cookie: Option<String>,
}

impl Client {
    pub(crate) fn new(app: Router) -> Client {
        Client { app, cookie: None }
    }

    async fn send(&mut self, request: Request<Body>) -> Answer {
        let response = self.app.clone().oneshot(request).await.expect("router");
        let status = response.status();
        let location = response
            .headers()
            .get(header::LOCATION)
            .map(|v| v.to_str().unwrap().to_owned());
        let set_cookie = response
            .headers()
            .get(header::SET_COOKIE)
            .map(|v| v.to_str().unwrap().to_owned());
        if let Some(set) = &set_cookie {
            self.cookie = Some(set.split(';').next().unwrap().to_owned());
        }
        let bytes = axum::body::to_bytes(response.into_body(), 4 << 20)
            .await
            .expect("body");
        Answer {
            status,
            location,
            set_cookie,
            body: String::from_utf8(bytes.to_vec()).expect("UTF-8 body"),
        }
    }

    /// `GET path`, with the cookie if the client has one.
    pub(crate) async fn get(&mut self, path: &str) -> Answer {
        let mut request = Request::get(path).header(header::HOST, "127.0.0.1:8080");
        if let Some(cookie) = &self.cookie {
            request = request.header(header::COOKIE, cookie.clone());
        }
        self.send(request.body(Body::empty()).unwrap()).await
    }

    /// `POST path` with `form` (already encoded) and `headers`.
    pub(crate) async fn post(
        &mut self,
        path: &str,
        form: &str,
        headers: &[(&str, &str)],
    ) -> Answer {
        let mut request = Request::post(path)
            .header(header::HOST, "127.0.0.1:8080")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        if let Some(cookie) = &self.cookie {
            request = request.header(header::COOKIE, cookie.clone());
        }
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        self.send(request.body(Body::from(form.to_owned())).unwrap())
            .await
    }

    /// The CSRF token the client's cookie holds (after a first GET).
    pub(crate) fn token(&self) -> String {
        self.cookie
            .as_deref()
            .and_then(|c| c.strip_prefix("pgfifo_csrf="))
            .expect("a page was loaded first")
            .to_owned()
    }

    /// Posts action `action` with `fields` and the client's own token.
    pub(crate) async fn act(&mut self, action: &str, fields: &str) -> Answer {
        let form = format!("csrf={}&{fields}", self.token());
        self.post(
            &format!("/actions/{action}"),
            &form,
            &[("origin", "http://127.0.0.1:8080")],
        )
        .await
    }
}

/// `s` percent-encoded for a path segment or form value.
pub(crate) fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

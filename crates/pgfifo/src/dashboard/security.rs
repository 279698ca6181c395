//! Who may use the dashboard, and proof that an action comes from its own
//! pages.
//!
//! **Cross-site requests.** Every response makes sure the browser holds a
//! random token in the `pgfifo_csrf` cookie (`HttpOnly`, `SameSite=Strict`),
//! and every action form carries the same token in a hidden field. An
//! action is done only when the two match (another site can make the
//! browser send the cookie, not read it) and, when the browser says where
//! the request comes from (`Origin`, `Sec-Fetch-Site`), that it comes from
//! the dashboard's own origin.
//!
//! **Access.** [`Access`] is what `pgfifo dashboard` asks of a client: a
//! token or basic-auth credentials, checked on every request. An
//! application that mounts [`router`](super::router) uses its own
//! authentication instead.

use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::fail::Fail;

const COOKIE: &str = "pgfifo_csrf";
const TOKEN_BYTES: usize = 32;

/// The CSRF token of the request's browser (from its cookie, or minted for
/// this response).
#[derive(Debug, Clone)]
pub(crate) struct CsrfToken {
    pub value: String,
    /// The browser did not send it: it arrives with this response.
    pub fresh: bool,
}

fn mint() -> String {
    let mut bytes = [0u8; TOKEN_BYTES];
    getrandom::fill(&mut bytes).expect("the operating system's random source");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn is_token(s: &str) -> bool {
    s.len() == TOKEN_BYTES * 2 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The value of cookie `name` in `headers`.
fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// Middleware: gives every request a [`CsrfToken`] and every browser the
/// cookie that holds it.
pub(crate) async fn csrf_cookie(mut request: Request, next: Next) -> Response {
    let token = match cookie(request.headers(), COOKIE).filter(|v| is_token(v)) {
        Some(value) => CsrfToken {
            value: value.to_owned(),
            fresh: false,
        },
        None => CsrfToken {
            value: mint(),
            fresh: true,
        },
    };
    request.extensions_mut().insert(token.clone());
    let mut response = next.run(request).await;
    if token.fresh {
        let cookie = format!(
            "{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict",
            token.value
        );
        if let Ok(value) = HeaderValue::from_str(&cookie) {
            response.headers_mut().append(header::SET_COOKIE, value);
        }
    }
    response
}

/// Equal in time that does not depend on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Checks that an action comes from the dashboard's own page: the form's
/// token matches the cookie's, and the browser does not say it comes from
/// elsewhere.
pub(crate) fn check_action(headers: &HeaderMap, token: &CsrfToken, sent: &str) -> Result<(), Fail> {
    let refused = |why: &str| Err(Fail::forbidden(format!("action refused: {why}")));
    if token.fresh || !same(token.value.as_bytes(), sent.as_bytes()) {
        return refused(
            "the form's token does not match this browser's (reload the page and try again)",
        );
    }
    if headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|site| site == "cross-site" || site == "same-site")
    {
        return refused("it comes from another site");
    }
    if let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
        let origin_host = origin.split_once("://").map(|(_, rest)| rest);
        if origin == "null" || origin_host.is_none() || origin_host != host {
            return refused("it comes from another origin");
        }
    }
    Ok(())
}

/// What a client of `pgfifo dashboard` must show.
#[derive(Clone, PartialEq, Eq)]
pub enum Access {
    /// Nothing (for loopback, or read-only behind a trusted network).
    Open,
    /// `Authorization: Bearer TOKEN`, or basic auth with TOKEN as the
    /// password (any user name), which browsers can send.
    Token(String),
    /// Basic auth with this user and password.
    Basic {
        /// The user name.
        user: String,
        /// The password.
        password: String,
    },
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Access::Open => f.write_str("Open"),
            Access::Token(_) => f.write_str("Token(***)"),
            Access::Basic { user, .. } => write!(f, "Basic {{ user: {user:?}, password: *** }}"),
        }
    }
}

impl Access {
    /// Whether `headers` carry what this access asks for.
    pub(crate) fn admits(&self, headers: &HeaderMap) -> bool {
        let authorization = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let basic = authorization
            .strip_prefix("Basic ")
            .and_then(|b| base64_decode(b.trim()))
            .and_then(|bytes| String::from_utf8(bytes).ok());
        let basic = basic.as_deref().and_then(|s| s.split_once(':'));
        match self {
            Access::Open => true,
            Access::Token(token) => {
                let bearer = authorization.strip_prefix("Bearer ").map(str::trim);
                bearer.is_some_and(|b| same(b.as_bytes(), token.as_bytes()))
                    || basic.is_some_and(|(_, p)| same(p.as_bytes(), token.as_bytes()))
            }
            Access::Basic { user, password } => basic.is_some_and(|(u, p)| {
                same(u.as_bytes(), user.as_bytes()) & same(p.as_bytes(), password.as_bytes())
            }),
        }
    }

    /// Middleware that answers 401 to a request this access does not admit.
    pub(crate) async fn require(self, request: Request, next: Next) -> Response {
        if self.admits(request.headers()) {
            return next.run(request).await;
        }
        (
            StatusCode::UNAUTHORIZED,
            [(
                header::WWW_AUTHENTICATE,
                "Basic realm=\"pgfifo\", charset=\"UTF-8\"",
            )],
            "authentication required\n",
        )
            .into_response()
    }
}

/// Middleware for a dashboard open to whoever reaches a loopback address:
/// only requests whose `Host` names the loopback interface on `port` are
/// answered (421 otherwise). A web page elsewhere cannot make the browser
/// talk to it under another name (DNS rebinding) and read or act as the
/// dashboard's own origin.
pub(crate) async fn loopback_host_only(port: u16, request: Request, next: Next) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let (name, given_port) = match host.rsplit_once(':') {
        Some((name, p)) if !name.ends_with(':') || name.starts_with('[') => (name, p.parse().ok()),
        _ => (host, Some(80)),
    };
    let loopback = matches!(name, "127.0.0.1" | "localhost" | "[::1]");
    if loopback && given_port == Some(port) {
        return next.run(request).await;
    }
    (
        StatusCode::MISDIRECTED_REQUEST,
        "this dashboard answers only to 127.0.0.1, localhost or [::1] on its own port\n",
    )
        .into_response()
}

/// Standard base64 (with or without padding); `None` if it is not.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    fn value(c: u8) -> Option<u32> {
        match c {
            b'A'..=b'Z' => Some(u32::from(c - b'A')),
            b'a'..=b'z' => Some(u32::from(c - b'a') + 26),
            b'0'..=b'9' => Some(u32::from(c - b'0') + 52),
            b'+' => Some(62),
            b'/' => Some(63),
            _ => None,
        }
    }
    let text = text.trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        acc = (acc << 6) | value(c)?;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(*k, HeaderValue::from_str(v).unwrap());
        }
        map
    }

    #[test]
    fn base64_decodes_what_browsers_send() {
        assert_eq!(base64_decode("YWRtaW46czNjcmV0").unwrap(), b"admin:s3cret");
        assert_eq!(base64_decode("YQ==").unwrap(), b"a");
        assert!(base64_decode("a*b").is_none());
    }

    #[test]
    fn access_checks_tokens_and_credentials() {
        let token = Access::Token("t0k".into());
        assert!(token.admits(&headers(&[("authorization", "Bearer t0k")])));
        // "x:t0k"
        assert!(token.admits(&headers(&[("authorization", "Basic eDp0MGs=")])));
        assert!(!token.admits(&headers(&[("authorization", "Bearer nope")])));
        assert!(!token.admits(&headers(&[])));
        let basic = Access::Basic {
            user: "admin".into(),
            password: "s3cret".into(),
        };
        assert!(basic.admits(&headers(&[("authorization", "Basic YWRtaW46czNjcmV0")])));
        // "admin:wrong"
        assert!(!basic.admits(&headers(&[("authorization", "Basic YWRtaW46d3Jvbmc=")])));
        assert!(!format!("{basic:?}").contains("s3cret"));
    }

    #[test]
    fn actions_need_the_cookie_token_and_the_same_origin() {
        let token = CsrfToken {
            value: "ab".repeat(TOKEN_BYTES),
            fresh: false,
        };
        let own = headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://127.0.0.1:8080"),
        ]);
        assert!(check_action(&own, &token, &token.value).is_ok());
        assert!(check_action(&own, &token, "cd").is_err());
        let fresh = CsrfToken {
            fresh: true,
            ..token.clone()
        };
        assert!(check_action(&own, &fresh, &token.value).is_err());
        let other = headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://evil.example"),
        ]);
        assert!(check_action(&other, &token, &token.value).is_err());
        let cross = headers(&[("host", "127.0.0.1:8080"), ("sec-fetch-site", "cross-site")]);
        assert!(check_action(&cross, &token, &token.value).is_err());
    }
}

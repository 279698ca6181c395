//! Where the dashboard is mounted: the path prefix its links, forms and
//! assets start with (`""` at the root, `/admin/jobs` under
//! `Router::nest("/admin/jobs", …)`).
//!
//! It is the request path without the part the dashboard's router saw. A
//! prefix with anything but plain path characters is refused (400): under a
//! mount with a path parameter it comes from the request, and a `\` or a
//! quote in it would reach the page's links.

use axum::extract::OriginalUri;
use axum::http::Uri;

tokio::task_local! {
    /// The prefix of the request being answered (for pages that have no
    /// request at hand, such as error pages).
    static BASE: String;
}

/// The prefix of a request whose path the router saw as `inner`.
pub(crate) fn base_of(inner: &Uri, original: Option<&OriginalUri>) -> Option<String> {
    let inner = inner.path();
    let original = original.map_or(inner, |uri| uri.0.path());
    let base = if inner == "/" {
        original.trim_end_matches('/')
    } else {
        original
            .strip_suffix(inner)
            .unwrap_or("")
            .trim_end_matches('/')
    };
    let plain = base
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/-._~%".contains(&b));
    plain.then(|| base.to_owned())
}

/// Answers `future` (a request's handling) with `base` as the prefix that
/// [`current`] returns.
pub(crate) async fn scope<F: std::future::Future>(base: String, future: F) -> F::Output {
    BASE.scope(base, future).await
}

/// The prefix, as a request extension.
#[derive(Debug, Clone)]
pub(crate) struct Base(pub String);

/// The prefix of the request being answered (`""` outside one).
pub(crate) fn current() -> String {
    BASE.try_with(Clone::clone).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(inner: &str, original: &str) -> Option<String> {
        let original = OriginalUri(original.parse().unwrap());
        base_of(&inner.parse().unwrap(), Some(&original))
    }

    #[test]
    fn the_prefix_is_what_the_router_did_not_see() {
        assert_eq!(base("/", "/").as_deref(), Some(""));
        assert_eq!(base("/jobs/7", "/jobs/7").as_deref(), Some(""));
        assert_eq!(base("/", "/ops/jobs").as_deref(), Some("/ops/jobs"));
        assert_eq!(base("/", "/ops/jobs/").as_deref(), Some("/ops/jobs"));
        assert_eq!(
            base("/jobs/7", "/ops/jobs/jobs/7").as_deref(),
            Some("/ops/jobs")
        );
        assert_eq!(base("/jobs/7", "/t%20x/jobs/7").as_deref(), Some("/t%20x"));
        assert_eq!(base("/jobs/7", "/a\\b/jobs/7"), None);
        assert_eq!(base("/jobs/7", "/a\"b/jobs/7"), None);
    }
}

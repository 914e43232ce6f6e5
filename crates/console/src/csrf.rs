//! Cross-site request forgery protection for every form post.
//!
//! Double-submit token: a page that shows a form sets a random token in a
//! `SameSite=Strict`, `HttpOnly` cookie (once per browser) and puts the same
//! token in a hidden field; a post is accepted only when both are present
//! and equal. Another site can make a browser post to the console but can
//! neither read the cookie nor set it, so it cannot supply the field. The
//! token is stateless, so it works across coordinator replicas. On top,
//! a post whose `Origin` is another origin, or that the browser marks as
//! `Sec-Fetch-Site: cross-site`, is refused before the token is looked at.

use axum::http::header::{COOKIE, HOST, ORIGIN};
use axum::http::{HeaderMap, HeaderValue};

/// The cookie holding the token.
pub const COOKIE_NAME: &str = "jobfence_csrf";
/// The hidden form field holding the token.
pub const FIELD: &str = "csrf";
/// Token length in hex characters (128 random bits).
const TOKEN_HEX: usize = 32;

/// Why a post was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CsrfRefusal {
    /// `Origin` names another site, or `Sec-Fetch-Site` says cross-site.
    #[error("the form was posted from another site")]
    CrossSite,
    /// No token cookie, no field, or they differ (e.g. the cookie was
    /// cleared after the page was loaded).
    #[error("the form's security token is missing or does not match this browser's")]
    TokenMismatch,
}

/// A fresh random token (hex).
pub fn new_token() -> String {
    let mut bytes = [0u8; TOKEN_HEX / 2];
    getrandom::getrandom(&mut bytes).expect("the operating system's random source");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn well_formed(token: &str) -> bool {
    token.len() == TOKEN_HEX && token.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The value of cookie `name` in the request, if any.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// The browser's token, and the `Set-Cookie` value to send when it has
/// none yet (or a malformed one).
pub fn ensure(headers: &HeaderMap) -> (String, Option<HeaderValue>) {
    match cookie(headers, COOKIE_NAME).filter(|t| well_formed(t)) {
        Some(t) => (t.to_owned(), None),
        None => {
            let token = new_token();
            let set = format!("{COOKIE_NAME}={token}; Path=/; HttpOnly; SameSite=Strict");
            let value = HeaderValue::from_str(&set).expect("hex is a valid header value");
            (token, Some(value))
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Accepts a post whose field `submitted` matches the cookie and that no
/// header marks as cross-site.
pub fn verify(headers: &HeaderMap, submitted: &str) -> Result<(), CsrfRefusal> {
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        if !matches!(site, "same-origin" | "none") {
            return Err(CsrfRefusal::CrossSite);
        }
    }
    if let Some(origin) = headers.get(ORIGIN).and_then(|v| v.to_str().ok()) {
        let host = headers.get(HOST).and_then(|v| v.to_str().ok());
        let same = host.is_some_and(|h| {
            origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"))
                == Some(h)
        });
        if !same {
            return Err(CsrfRefusal::CrossSite);
        }
    }
    match cookie(headers, COOKIE_NAME) {
        Some(c) if well_formed(c) && constant_time_eq(c.as_bytes(), submitted.as_bytes()) => Ok(()),
        _ => Err(CsrfRefusal::TokenMismatch),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn a_page_sets_the_cookie_once() {
        let (token, set) = ensure(&HeaderMap::new());
        assert!(well_formed(&token));
        let set = set.expect("a new browser gets the cookie");
        let set = set.to_str().unwrap();
        assert!(set.starts_with(&format!("{COOKIE_NAME}={token};")));
        assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict"));
        let cookie = format!("other=1; {COOKIE_NAME}={token}");
        let (again, set) = ensure(&headers(&[("cookie", &cookie)]));
        assert_eq!((again, set), (token, None));
        assert_ne!(new_token(), new_token());
    }

    #[test]
    fn a_post_needs_the_cookie_and_the_same_field() {
        let token = new_token();
        let cookie = format!("{COOKIE_NAME}={token}");
        let same_site = headers(&[
            ("cookie", &cookie),
            ("host", "127.0.0.1:9465"),
            ("origin", "http://127.0.0.1:9465"),
            ("sec-fetch-site", "same-origin"),
        ]);
        assert_eq!(verify(&same_site, &token), Ok(()));
        assert_eq!(
            verify(&same_site, &new_token()),
            Err(CsrfRefusal::TokenMismatch)
        );
        assert_eq!(verify(&same_site, ""), Err(CsrfRefusal::TokenMismatch));
        let no_cookie = headers(&[("host", "127.0.0.1:9465")]);
        assert_eq!(verify(&no_cookie, &token), Err(CsrfRefusal::TokenMismatch));
    }

    #[test]
    fn a_post_from_another_site_is_refused_even_with_a_token() {
        let token = new_token();
        let cookie = format!("{COOKIE_NAME}={token}");
        let other_origin = headers(&[
            ("cookie", &cookie),
            ("host", "127.0.0.1:9465"),
            ("origin", "http://evil.example"),
        ]);
        assert_eq!(verify(&other_origin, &token), Err(CsrfRefusal::CrossSite));
        let cross = headers(&[
            ("cookie", &cookie),
            ("host", "127.0.0.1:9465"),
            ("sec-fetch-site", "cross-site"),
        ]);
        assert_eq!(verify(&cross, &token), Err(CsrfRefusal::CrossSite));
    }
}

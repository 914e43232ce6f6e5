//! Who acts in the console.
//!
//! Today the operator types their name into each form, and it is recorded
//! exactly as `JobAdmin` records the `operator` field of a request (in the
//! event's detail, the job's `state_reason` and the log). Nothing checks it:
//! there is no authentication yet (issue 8). The name travels as an
//! [`Operator`] with its [`OperatorSource`], so when credentials land the
//! console takes the identity from the verified credential instead, the
//! form field goes, and nothing below the console changes.

use axum::http::{HeaderMap, HeaderValue};

/// Where the operator's identity came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperatorSource {
    /// Typed into the form by the person, unverified.
    Typed,
}

/// The person resolving a job, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    /// The name recorded in the job's history.
    pub name: String,
    /// How we know it.
    pub source: OperatorSource,
}

/// The cookie remembering the last typed name, so the next form is
/// prefilled (a convenience, never an identity).
pub const REMEMBER_COOKIE: &str = "jobfence_operator";

impl Operator {
    /// The operator of a form post: today, the name typed into its
    /// `operator` field (trimmed; the coordinator refuses an empty one).
    pub fn from_form(typed: &str) -> Operator {
        Operator {
            name: typed.trim().to_owned(),
            source: OperatorSource::Typed,
        }
    }
}

/// The name to prefill, from [`REMEMBER_COOKIE`].
pub fn remembered(headers: &HeaderMap) -> Option<String> {
    super::csrf::cookie(headers, REMEMBER_COOKIE).and_then(decode)
}

/// The `Set-Cookie` value that remembers `name`.
pub fn remember(name: &str) -> Option<HeaderValue> {
    if name.is_empty() {
        return None;
    }
    let set = format!(
        "{REMEMBER_COOKIE}={}; Path=/; HttpOnly; SameSite=Strict; Max-Age=31536000",
        encode(name)
    );
    HeaderValue::from_str(&set).ok()
}

/// Percent-encodes every byte but `[A-Za-z0-9._-]` (a cookie value may not
/// hold spaces, `;` or `,`).
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remembered_name_survives_the_cookie() {
        let name = "Alice O'Neil; on call";
        let set = remember(name).unwrap();
        let value = set.to_str().unwrap().split(';').next().unwrap().to_owned();
        let mut headers = HeaderMap::new();
        headers.insert("cookie", HeaderValue::from_str(&value).unwrap());
        assert_eq!(remembered(&headers).as_deref(), Some(name));
        assert_eq!(remember(""), None);
    }

    #[test]
    fn the_typed_name_is_the_operator() {
        let op = Operator::from_form("  alice ");
        assert_eq!(op.name, "alice");
        assert_eq!(op.source, OperatorSource::Typed);
    }
}

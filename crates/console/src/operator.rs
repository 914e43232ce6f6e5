//! Who acts in the console.
//!
//! When the coordinator authenticates its callers, the console acts with
//! one operator credential of its own (`--console-token-file`), the way
//! `kubectl proxy` acts with its user's: the token is checked against the
//! callers file on every request (a revoked or expired one stops the
//! console at once), and the operator recorded is that credential's name;
//! the form has no name field. Anyone who can reach the console's loopback
//! address acts as that operator, so it runs where that operator works.
//!
//! Without authentication (`--insecure`), the operator types their name
//! into each form, recorded exactly as `JobAdmin` records the `operator`
//! field of a request; nothing checks it. Either way the name travels as
//! an [`Operator`] with its [`OperatorSource`].

use axum::http::{HeaderMap, HeaderValue};
use jobfence_auth::{Action, Authenticator, Refusal};
use std::sync::Arc;

/// Where the operator's identity came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperatorSource {
    /// Typed into the form by the person, unverified (`--insecure`).
    Typed,
    /// The console's operator credential, verified against the callers
    /// file.
    Credential,
}

/// How the console knows who acts.
#[derive(Debug, Clone)]
pub enum Identity {
    /// Names typed into the forms (a coordinator without authentication).
    Typed,
    /// One operator credential, checked on every request.
    Credential {
        /// The coordinator's callers (reloaded with it on SIGHUP).
        auth: Arc<Authenticator>,
        /// The bearer token the console presents.
        token: Arc<str>,
    },
}

impl Identity {
    /// How the console of a coordinator knows its operator: typed names
    /// when the coordinator does not authenticate (`auth` is `None`); with
    /// it, the operator `token` it was given, checked now (a console that
    /// could not act is refused at start).
    pub fn for_coordinator(
        auth: Option<Arc<Authenticator>>,
        token: Option<String>,
    ) -> anyhow::Result<Identity> {
        let Some(auth) = auth else {
            return Ok(Identity::Typed);
        };
        let Some(token) = token else {
            anyhow::bail!(
                "the console needs an operator credential (--console-token-file) when the \
                 coordinator authenticates its callers"
            );
        };
        let identity = Identity::Credential {
            auth,
            token: token.into(),
        };
        if let Some(Err(refusal)) = identity.credential() {
            anyhow::bail!("the console's operator credential is not accepted: {refusal}");
        }
        Ok(identity)
    }

    /// The operator of the console's credential, checked now: `None` for
    /// [`Identity::Typed`]; a refusal when the token is unknown, revoked,
    /// expired, or holds no operator role.
    pub fn credential(&self) -> Option<Result<Operator, Refusal>> {
        let Identity::Credential { auth, token } = self else {
            return None;
        };
        let header = format!("Bearer {token}");
        Some(
            auth.authenticate(Some(header.as_bytes()), None)
                .and_then(|caller| {
                    if caller.may(Action::Admin) {
                        Ok(Operator {
                            name: caller.name,
                            source: OperatorSource::Credential,
                        })
                    } else {
                        Err(Refusal::RoleNotAllowed {
                            roles: caller.roles(),
                            caller: caller.name,
                            method: "the operator console".into(),
                            required: Action::Admin.required_roles(),
                        })
                    }
                }),
        )
    }
}

/// What the resolution form shows of the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OperatorField {
    /// A name field, prefilled with the remembered name if any.
    Typed(Option<String>),
    /// No field: the resolution is recorded under this credential's name.
    Fixed(String),
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

    /// The redirect after this operator's post was applied: to `to`,
    /// remembering a typed name for the next form ([`remember`]; a
    /// credential's name is never stored in a cookie).
    pub fn redirect_after_post(&self, to: &str) -> axum::response::Response {
        use axum::response::IntoResponse;
        let mut r = axum::response::Redirect::to(to).into_response();
        if let (OperatorSource::Typed, Some(c)) = (self.source, remember(&self.name)) {
            r.headers_mut().append(axum::http::header::SET_COOKIE, c);
        }
        r
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

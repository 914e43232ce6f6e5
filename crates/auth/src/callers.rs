//! The callers file: who may call, with which roles on which queues, and
//! how each proves it. One caller grant per line, fields separated by
//! spaces; `#` starts a comment:
//!
//! ```text
//! # NAME        ROLE           QUEUES           CREDENTIAL            [expires=RFC3339]
//! rust-1        worker         refunds          sha256:9f86d081884c7d65…
//! shop          producer       refunds,payouts  sha256:2c26b46b68ffc68f…
//! alice         operator       *                sha256:fcde2b2edba56bf4…  expires=2027-01-31T00:00:00Z
//! alice         events-reader  *                sha256:fcde2b2edba56bf4…
//! stripe-hooks  webhook        refunds          cert
//! ```
//!
//! - QUEUES is a comma-separated list, or `*` for every queue (an
//!   operator's must be `*`: operators act on every queue).
//! - CREDENTIAL is `sha256:` and the hex SHA-256 of a bearer token (the
//!   coordinator never holds the token itself; `jobfence credentials
//!   token` issues one and prints its line), or `cert`: a client
//!   certificate, verified against `--tls-client-ca`, whose subject common
//!   name is NAME.
//! - Lines with the same credential are one caller holding several roles;
//!   their names must agree, and the earliest `expires=` of them applies.
//!
//! Why hashed static tokens and not JWTs: docs/security.md. The file is
//! read at start and again on SIGHUP ([`Authenticator::reload`]); a file
//! that does not parse is refused whole and the previous one stays in force.

use super::{Caller, CredentialKind, Grant, Refusal, Role};
use anyhow::Context;
use chrono::{DateTime, Utc};
use jobfence_domain::QueueScope;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// The SHA-256 of a token, as the callers file stores it.
pub type TokenDigest = [u8; 32];

/// The digest of `token` (its UTF-8 bytes).
pub fn token_digest(token: &str) -> TokenDigest {
    Sha256::digest(token.as_bytes()).into()
}

/// One caller of the file: its name, grants and expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    name: String,
    grants: Vec<Grant>,
    expires: Option<DateTime<Utc>>,
}

impl Entry {
    fn caller(&self, credential: CredentialKind, now: DateTime<Utc>) -> Result<Caller, Refusal> {
        if let Some(expired_at) = self.expires.filter(|e| *e <= now) {
            return Err(Refusal::CredentialExpired {
                caller: self.name.clone(),
                expired_at,
            });
        }
        Ok(Caller {
            name: self.name.clone(),
            credential,
            grants: self.grants.clone(),
        })
    }
}

/// A parsed callers file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Callers {
    tokens: HashMap<TokenDigest, Entry>,
    certificates: HashMap<String, Entry>,
}

/// The longest caller name: it is recorded as an operator and logged.
const MAX_NAME_BYTES: usize = 255;

impl Callers {
    /// Parses the text of a callers file; the error names the line.
    pub fn parse(text: &str) -> anyhow::Result<Callers> {
        let mut callers = Callers::default();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            callers
                .add_line(line)
                .with_context(|| format!("line {}", i + 1))?;
        }
        Ok(callers)
    }

    /// Reads and parses the callers file at `path`.
    pub fn load(path: &Path) -> anyhow::Result<Callers> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the callers file {}", path.display()))?;
        let callers = Callers::parse(&text)
            .with_context(|| format!("in the callers file {}", path.display()))?;
        // Empty, every call would be refused: most likely a file caught
        // half-written by a reload. Refused, so the callers in force stay.
        if callers.tokens.is_empty() && callers.certificates.is_empty() {
            anyhow::bail!(
                "the callers file {} names no caller (every call would be refused)",
                path.display()
            );
        }
        Ok(callers)
    }

    fn add_line(&mut self, line: &str) -> anyhow::Result<()> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [name, role, queues, credential, rest @ ..] = fields.as_slice() else {
            anyhow::bail!("expected NAME ROLE QUEUES CREDENTIAL [expires=RFC3339]");
        };
        if name.len() > MAX_NAME_BYTES || !name.chars().all(|c| c.is_ascii_graphic()) {
            anyhow::bail!("name must be 1..=255 printable ASCII characters");
        }
        let role: Role = role.parse().map_err(anyhow::Error::msg)?;
        let queues = parse_queues(queues)?;
        if role == Role::Operator && !queues.is_any() {
            anyhow::bail!("an operator acts on every queue: its QUEUES must be *");
        }
        let mut expires = None;
        for extra in rest {
            let Some(at) = extra.strip_prefix("expires=") else {
                anyhow::bail!("unknown field {extra:?} (only expires=RFC3339)");
            };
            let at = DateTime::parse_from_rfc3339(at)
                .with_context(|| format!("expires={at} is not an RFC 3339 time"))?;
            expires = Some(at.with_timezone(&Utc));
        }
        let grant = Grant { role, queues };
        let fresh = || Entry {
            name: (*name).to_owned(),
            grants: Vec::new(),
            expires: None,
        };
        let entry = if *credential == "cert" {
            self.certificates
                .entry((*name).to_owned())
                .or_insert_with(fresh)
        } else {
            let hex = credential
                .strip_prefix("sha256:")
                .context("CREDENTIAL must be sha256:<hex of the token's SHA-256> or cert")?;
            let entry = self.tokens.entry(parse_digest(hex)?).or_insert_with(fresh);
            if entry.name != *name {
                anyhow::bail!(
                    "this token already belongs to {:?}; one token names one caller",
                    entry.name
                );
            }
            entry
        };
        merge(entry, grant, expires);
        Ok(())
    }

    /// How many tokens and certificate bindings the file holds.
    pub fn counts(&self) -> (usize, usize) {
        (self.tokens.len(), self.certificates.len())
    }

    /// The caller a credential names. A bearer token, when presented,
    /// decides alone (an unknown one is refused even beside a valid
    /// certificate); otherwise the certificate's common name. A certificate
    /// the file does not bind is a caller without roles: every call of it
    /// is refused as ROLE_NOT_ALLOWED.
    pub fn authenticate(
        &self,
        token: Option<&str>,
        certificate_name: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<Caller, Refusal> {
        if let Some(token) = token {
            return match self.tokens.get(&token_digest(token)) {
                Some(entry) => entry.caller(CredentialKind::Token, now),
                None => Err(Refusal::CredentialInvalid {
                    problem: "unknown bearer token (wrong, tampered with, or revoked)",
                }),
            };
        }
        match certificate_name {
            Some(name) => match self.certificates.get(name) {
                Some(entry) => entry.caller(CredentialKind::Certificate, now),
                None => Ok(Caller {
                    name: name.to_owned(),
                    credential: CredentialKind::Certificate,
                    grants: Vec::new(),
                }),
            },
            None => Err(Refusal::CredentialMissing),
        }
    }
}

fn merge(entry: &mut Entry, grant: Grant, expires: Option<DateTime<Utc>>) {
    entry.grants.push(grant);
    entry.expires = match (entry.expires, expires) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
}

fn parse_queues(field: &str) -> anyhow::Result<QueueScope> {
    let mut names = Vec::new();
    for q in field.split(',') {
        let valid = q == "*"
            || (!q.is_empty()
                && q.len() <= 128
                && q.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')));
        if !valid {
            anyhow::bail!("queue {q:?} is not * or 1..=128 bytes of [A-Za-z0-9._-]");
        }
        names.push(q);
    }
    if names.len() > 1 && names.contains(&"*") {
        anyhow::bail!("queues {field:?}: `*` (every queue) stands alone, not in a list");
    }
    Ok(QueueScope::of(names))
}

fn parse_digest(hex: &str) -> anyhow::Result<TokenDigest> {
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        anyhow::bail!("a SHA-256 is 64 hex digits (got {})", bytes.len());
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).context("not hex")?;
        out[i] = u8::from_str_radix(s, 16).with_context(|| format!("{s:?} is not hex"))?;
    }
    Ok(out)
}

/// The callers in force, swapped whole on reload. Cheap to share.
#[derive(Debug)]
pub struct Authenticator {
    path: Option<PathBuf>,
    current: RwLock<Arc<Callers>>,
}

impl Authenticator {
    /// Reads the callers file at `path` (reloaded from there later).
    pub fn from_file(path: impl Into<PathBuf>) -> anyhow::Result<Authenticator> {
        let path = path.into();
        let callers = Callers::load(&path)?;
        Ok(Authenticator {
            path: Some(path),
            current: RwLock::new(Arc::new(callers)),
        })
    }

    /// Fixed callers, never reloaded (tests, an embedded coordinator).
    pub fn fixed(callers: Callers) -> Authenticator {
        Authenticator {
            path: None,
            current: RwLock::new(Arc::new(callers)),
        }
    }

    /// Reads the file again and puts it in force; on an error the previous
    /// callers stay. Returns the new (tokens, certificate bindings) counts.
    pub fn reload(&self) -> anyhow::Result<(usize, usize)> {
        let Some(path) = &self.path else {
            return Ok(self.callers().counts());
        };
        let callers = Callers::load(path)?;
        let counts = callers.counts();
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(callers);
        Ok(counts)
    }

    /// The callers in force now.
    pub fn callers(&self) -> Arc<Callers> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The caller of a request: its `authorization` metadata (raw, if any)
    /// and its verified client certificate's common name (if any). See
    /// [`Callers::authenticate`].
    pub fn authenticate(
        &self,
        authorization: Option<&[u8]>,
        certificate_name: Option<&str>,
    ) -> Result<Caller, Refusal> {
        let token = match authorization {
            None => None,
            Some(raw) => Some(bearer(raw)?),
        };
        self.callers()
            .authenticate(token, certificate_name, Utc::now())
    }
}

/// The token of an `authorization: Bearer <token>` value.
fn bearer(raw: &[u8]) -> Result<&str, Refusal> {
    let malformed = Refusal::CredentialInvalid {
        problem: "the authorization metadata is not `Bearer <token>`",
    };
    let value = std::str::from_utf8(raw).map_err(|_| malformed.clone())?;
    let (scheme, token) = value.trim().split_once(' ').ok_or(malformed.clone())?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Err(malformed);
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(name: &str, role: &str, queues: &str, token: &str) -> String {
        let hex: String = token_digest(token)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("{name} {role} {queues} sha256:{hex}")
    }

    #[test]
    fn tokens_and_certificates_name_their_callers() {
        let text = [
            "# a comment".to_owned(),
            line("rust-1", "worker", "refunds", "t-rust"),
            line("alice", "operator", "*", "t-alice") + " expires=2000-01-01T00:00:00Z",
            line("alice", "events-reader", "*", "t-alice"),
            "hooks webhook refunds cert   # trailing comment".to_owned(),
        ]
        .join("\n");
        let callers = Callers::parse(&text).unwrap();
        assert_eq!(callers.counts(), (2, 1));
        let now = Utc::now();
        let rust = callers.authenticate(Some("t-rust"), None, now).unwrap();
        assert_eq!(rust.name, "rust-1");
        assert_eq!(rust.credential, CredentialKind::Token);
        assert!(matches!(
            callers.authenticate(Some("t-alice"), None, now),
            Err(Refusal::CredentialExpired { .. })
        ));
        assert!(matches!(
            callers.authenticate(Some("t-rust!"), Some("hooks"), now),
            Err(Refusal::CredentialInvalid { .. })
        ));
        let hooks = callers.authenticate(None, Some("hooks"), now).unwrap();
        assert_eq!(hooks.grants[0].role, Role::Webhook);
        let stranger = callers.authenticate(None, Some("mallory"), now).unwrap();
        assert!(stranger.grants.is_empty());
        assert_eq!(
            callers.authenticate(None, None, now),
            Err(Refusal::CredentialMissing)
        );
    }

    #[test]
    fn a_bad_line_is_refused_with_its_number() {
        for (bad, why) in [
            ("x worker", "expected NAME"),
            ("x king * cert", "unknown role"),
            ("x operator refunds cert", "every queue"),
            ("x worker bad/queue cert", "not * or"),
            ("x worker q sha256:abc", "64 hex"),
            ("x worker q password", "CREDENTIAL must be"),
            ("x worker q cert expires=tomorrow", "RFC 3339"),
        ] {
            let err = Callers::parse(&format!("\n{bad}")).unwrap_err();
            let text = format!("{err:#}");
            assert!(text.contains("line 2"), "{text}");
            assert!(text.contains(why), "{bad}: {text}");
        }
        let twice = [line("a", "worker", "q", "t"), line("b", "worker", "q", "t")].join("\n");
        assert!(format!("{:#}", Callers::parse(&twice).unwrap_err()).contains("one caller"));
        // `*` in a list would silently grant every queue.
        let mixed = line("a", "worker", "refunds,*", "t");
        assert!(format!("{:#}", Callers::parse(&mixed).unwrap_err()).contains("stands alone"));
    }

    #[test]
    fn only_bearer_authorization_is_read() {
        assert_eq!(bearer(b"Bearer abc").unwrap(), "abc");
        assert_eq!(bearer(b"bearer  abc ").unwrap(), "abc");
        for bad in [&b"Basic abc"[..], b"Bearer", b"Bearer ", b"\xff"] {
            assert!(bearer(bad).is_err());
        }
    }
}

//! Who may call what: callers, their roles, and the checks that refuse the
//! others (docs/security.md has the threat model).
//!
//! A caller presents a bearer token (`authorization: Bearer …` metadata)
//! or a client certificate (mutual TLS; its subject's common name names
//! the caller). Both are looked up in the callers file ([`callers`]),
//! which binds names to roles, each role scoped to queues:
//!
//! | role | may call | scoped to queues |
//! |---|---|---|
//! | `worker` | Enqueue, EnqueueBatch, Claim, Takeover, RenewLease, Complete, Fail, RecordObservation, GetJob | yes |
//! | `producer` | Enqueue, EnqueueBatch, GetJob | yes |
//! | `operator` | JobAdmin (jobs, providers and their budgets, queue policies); the operator recorded is the credential's name | no (every queue) |
//! | `events-reader` | JobEvents | yes |
//! | `webhook` | RecordObservation with source WEBHOOK only | yes |
//!
//! Health and reflection need no credential. The checks happen in two
//! places: [`layer`] authenticates every call and checks its method
//! against the caller's roles before any handler runs (UNAUTHENTICATED,
//! or PERMISSION_DENIED / `ROLE_NOT_ALLOWED`); the handlers then ask the
//! caller's [`QueueScope`] about the queue the call acts on, where that
//! queue is known (PERMISSION_DENIED / `QUEUE_NOT_ALLOWED`; for a call
//! naming a job, inside the same transaction as its write). A refused call
//! writes nothing.
//!
//! - [`callers`]: the callers file (hashed tokens, certificate bindings),
//!   reloaded on SIGHUP.
//! - [`layer`]: the tower layer that authenticates and checks roles.
//! - [`pki`]: issuing tokens and a throw-away CA for development.
//! - [`certificate`]: the caller's name in a client certificate.
//! - [`refusal`]: a refusal as a gRPC status (code, ErrorInfo reason).

pub mod callers;
pub mod certificate;
pub mod layer;
pub mod pki;
pub mod refusal;

use chrono::{DateTime, Utc};
use jobfence_domain::{ObservationSource, QueueScope};
use std::fmt;
use std::sync::Arc;

pub use callers::{Authenticator, Callers};
pub use layer::AuthLayer;

/// A role of the callers file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// Works jobs of its queues (and may enqueue and observe them).
    Worker,
    /// Enqueues jobs of its queues and reads them.
    Producer,
    /// JobAdmin: inspects, resolves and cancels jobs of every queue, and
    /// manages provider budgets, pauses and stored queue policies.
    Operator,
    /// Reads the events feed of its queues.
    EventsReader,
    /// Records observations with source WEBHOOK on jobs of its queues.
    Webhook,
}

impl Role {
    /// Every role, in the order the docs list them.
    pub const ALL: [Role; 5] = [
        Role::Worker,
        Role::Producer,
        Role::Operator,
        Role::EventsReader,
        Role::Webhook,
    ];

    /// The role's name in the callers file.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Worker => "worker",
            Role::Producer => "producer",
            Role::Operator => "operator",
            Role::EventsReader => "events-reader",
            Role::Webhook => "webhook",
        }
    }

    /// Whether this role may make calls of `action`.
    pub fn allows(self, action: Action) -> bool {
        use Action::*;
        match self {
            Role::Worker => matches!(action, Enqueue | Work | Observe | ReadJob),
            Role::Producer => matches!(action, Enqueue | ReadJob),
            Role::Operator => matches!(action, Admin | Observe),
            Role::EventsReader => matches!(action, ReadEvents),
            Role::Webhook => matches!(action, Observe),
        }
    }

    /// Whether the role's Observe grant covers observations from `source`:
    /// each reports under its own name only, so evidence an operator
    /// weighs in manual review says truly where it came from. A worker
    /// reports WORKER (what its provider call returned) and RECONCILER
    /// (what a takeover's reconcile found); a webhook WEBHOOK; an operator
    /// OPERATOR.
    pub fn observes(self, source: ObservationSource) -> bool {
        use ObservationSource as S;
        match self {
            Role::Worker => matches!(source, S::Worker | S::Reconciler),
            Role::Webhook => source == S::Webhook,
            Role::Operator => source == S::Operator,
            Role::Producer | Role::EventsReader => false,
        }
    }
}

impl std::str::FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Role::ALL.iter().map(|r| r.as_str()).collect();
                format!("unknown role {s:?} (one of {})", names.join(", "))
            })
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a call does, as far as permissions go. Each gRPC method maps to
/// one ([`Action::of_method`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Health checks and reflection: no credential needed.
    Open,
    /// Enqueue, EnqueueBatch.
    Enqueue,
    /// Claim, Takeover, RenewLease, Complete, Fail: holding jobs.
    Work,
    /// RecordObservation.
    Observe,
    /// GetJob of JobCoordinator.
    ReadJob,
    /// Every JobAdmin method.
    Admin,
    /// Every JobEvents method.
    ReadEvents,
    /// A path of no known service: needs a credential, and the router
    /// answers UNIMPLEMENTED.
    Unknown,
}

impl Action {
    /// The action of a gRPC request path (`/package.Service/Method`).
    pub fn of_method(path: &str) -> Action {
        let path = path.trim_start_matches('/');
        let (service, method) = path.split_once('/').unwrap_or((path, ""));
        match service {
            "grpc.health.v1.Health"
            | "grpc.reflection.v1.ServerReflection"
            | "grpc.reflection.v1alpha.ServerReflection" => Action::Open,
            "jobfence.v1.JobAdmin" => Action::Admin,
            "jobfence.v1.JobEvents" => Action::ReadEvents,
            "jobfence.v1.JobCoordinator" => match method {
                "Enqueue" | "EnqueueBatch" => Action::Enqueue,
                "Claim" | "Takeover" | "RenewLease" | "Complete" | "Fail" => Action::Work,
                "RecordObservation" => Action::Observe,
                "GetJob" => Action::ReadJob,
                _ => Action::Unknown,
            },
            _ => Action::Unknown,
        }
    }

    /// The roles that may make calls of this action, as a refusal names
    /// them (`worker or producer`).
    pub fn required_roles(self) -> String {
        let roles: Vec<&str> = Role::ALL
            .into_iter()
            .filter(|r| r.allows(self))
            .map(Role::as_str)
            .collect();
        if roles.is_empty() {
            "none".into()
        } else {
            roles.join(" or ")
        }
    }
}

/// One line of the callers file: a role and the queues it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// What the caller may do.
    pub role: Role,
    /// Where (every queue for an operator).
    pub queues: QueueScope,
}

/// How a caller proved who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialKind {
    /// A bearer token, found by its SHA-256 in the callers file.
    Token,
    /// A client certificate verified against `--tls-client-ca`, bound to a
    /// name in the callers file by its subject's common name.
    Certificate,
}

impl CredentialKind {
    /// `token` or `certificate`, as logged.
    pub fn as_str(self) -> &'static str {
        match self {
            CredentialKind::Token => "token",
            CredentialKind::Certificate => "certificate",
        }
    }
}

/// An authenticated caller, as the handlers see it (a request extension
/// set by [`AuthLayer`]). Absent when the coordinator runs without
/// authentication (`--insecure`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The name from the callers file: the operator recorded in events,
    /// the `caller` of every log line and refusal.
    pub name: String,
    /// Token or certificate.
    pub credential: CredentialKind,
    /// Everything the caller may do.
    pub grants: Vec<Grant>,
}

impl Caller {
    /// The queues the caller may act on for `action`; `None` when no role
    /// of the caller allows the action at all.
    pub fn scope(&self, action: Action) -> Option<QueueScope> {
        self.scope_where(|r| r.allows(action))
    }

    /// The queues the caller may record observations from `source` on;
    /// `None` when no role allows that source (a webhook reporting as a
    /// worker).
    pub fn observe_scope(&self, source: ObservationSource) -> Option<QueueScope> {
        self.scope_where(|r| r.observes(source))
    }

    fn scope_where(&self, pred: impl Fn(Role) -> bool) -> Option<QueueScope> {
        self.grants
            .iter()
            .filter(|g| pred(g.role))
            .map(|g| g.queues.clone())
            .reduce(|a, b| a.union(&b))
    }

    /// Whether any role allows `action` (the method check of [`AuthLayer`]).
    pub fn may(&self, action: Action) -> bool {
        action == Action::Open || self.grants.iter().any(|g| g.role.allows(action))
    }

    /// The caller's roles, as a refusal names them (`worker, producer`).
    pub fn roles(&self) -> String {
        let mut roles: Vec<&str> = self.grants.iter().map(|g| g.role.as_str()).collect();
        roles.sort_unstable();
        roles.dedup();
        if roles.is_empty() {
            "none".into()
        } else {
            roles.join(", ")
        }
    }
}

/// The queues a RecordObservation from `source` may name: every queue
/// without authentication (`caller` is `None`); with it, the queues of the
/// caller's roles that report under that source's name (a webhook reports
/// WEBHOOK only, so evidence says truly where it came from). Refused
/// `RoleNotAllowed`, naming the source, when no role of the caller does.
pub fn observation_scope(
    caller: Option<&Caller>,
    source: ObservationSource,
) -> Result<QueueScope, Refusal> {
    let Some(c) = caller else {
        return Ok(QueueScope::Any);
    };
    c.observe_scope(source).ok_or_else(|| {
        let required: Vec<&str> = Role::ALL
            .into_iter()
            .filter(|role| role.observes(source))
            .map(Role::as_str)
            .collect();
        Refusal::RoleNotAllowed {
            caller: c.name.clone(),
            roles: c.roles(),
            method: format!(
                "RecordObservation with source {}",
                source.as_str().to_uppercase()
            ),
            required: required.join(" or "),
        }
    })
}

/// The caller of a request, if the server authenticates.
pub fn caller_of<T>(request: &tonic::Request<T>) -> Option<Arc<Caller>> {
    request.extensions().get::<Arc<Caller>>().cloned()
}

/// Why a call was refused for who its caller is. Never carries a secret:
/// a token is named by its caller (once known), never by its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No `authorization` metadata and no client certificate.
    #[error(
        "no credential: send `authorization: Bearer <token>` metadata (or a client certificate)"
    )]
    CredentialMissing,
    /// A credential the callers file does not know, or a malformed one.
    #[error("credential not accepted: {problem}")]
    CredentialInvalid {
        /// What was wrong, in words that never quote the credential.
        problem: &'static str,
    },
    /// A known credential past its `expires=`.
    #[error("the credential of {caller} expired at {}", expired_at.to_rfc3339())]
    CredentialExpired {
        /// Whose credential.
        caller: String,
        /// When it expired (coordinator clock).
        expired_at: DateTime<Utc>,
    },
    /// The caller's roles do not allow the method (or, for a webhook, the
    /// observation source).
    #[error("{caller} (roles: {roles}) may not call {method}: it needs the role {required}")]
    RoleNotAllowed {
        /// Who called.
        caller: String,
        /// The caller's roles.
        roles: String,
        /// The gRPC path, or `RecordObservation(source=WORKER)`.
        method: String,
        /// The roles that would allow it.
        required: String,
    },
    /// An operator call naming another operator than the credential's.
    #[error("{caller} may not act as operator {requested:?}: the operator recorded is the credential's name, {caller}")]
    OperatorMismatch {
        /// Who called (the credential's name).
        caller: String,
        /// The name the request gave.
        requested: String,
    },
}

impl Refusal {
    /// The operator name to record for a JobAdmin write: the credential's
    /// name when the server authenticates (the request's own field may be
    /// empty or the same name; any other is refused), else the request's.
    pub fn operator_for(caller: Option<&Caller>, requested: &str) -> Result<String, Refusal> {
        match caller {
            None => Ok(requested.to_owned()),
            Some(c) if requested.is_empty() || requested == c.name => Ok(c.name.clone()),
            Some(c) => Err(Refusal::OperatorMismatch {
                caller: c.name.clone(),
                requested: requested.to_owned(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(grants: &[(Role, &[&str])]) -> Caller {
        Caller {
            name: "c".into(),
            credential: CredentialKind::Token,
            grants: grants
                .iter()
                .map(|(role, queues)| Grant {
                    role: *role,
                    queues: QueueScope::of(queues.iter().copied()),
                })
                .collect(),
        }
    }

    #[test]
    fn methods_map_to_actions() {
        assert_eq!(
            Action::of_method("/jobfence.v1.JobCoordinator/Complete"),
            Action::Work
        );
        assert_eq!(
            Action::of_method("/jobfence.v1.JobAdmin/CancelJob"),
            Action::Admin
        );
        assert_eq!(
            Action::of_method("/grpc.health.v1.Health/Check"),
            Action::Open
        );
        assert_eq!(
            Action::of_method("/jobfence.v1.JobCoordinator/Nope"),
            Action::Unknown
        );
        assert_eq!(Action::Enqueue.required_roles(), "worker or producer");
        assert_eq!(Action::Unknown.required_roles(), "none");
    }

    #[test]
    fn scopes_are_the_union_of_the_grants_that_allow_the_action() {
        let c = caller(&[
            (Role::Worker, &["refunds"]),
            (Role::Producer, &["payouts"]),
            (Role::Webhook, &["*"]),
        ]);
        let enqueue = c.scope(Action::Enqueue).unwrap();
        assert!(enqueue.allows("refunds") && enqueue.allows("payouts"));
        let work = c.scope(Action::Work).unwrap();
        assert!(work.allows("refunds") && !work.allows("payouts"));
        assert!(c.scope(Action::Admin).is_none());
        assert!(c
            .observe_scope(ObservationSource::Webhook)
            .unwrap()
            .is_any());
        let worker_source = c.observe_scope(ObservationSource::Worker).unwrap();
        assert!(!worker_source.allows("payouts"));
        let hook = caller(&[(Role::Webhook, &["*"])]);
        assert!(hook.observe_scope(ObservationSource::Worker).is_none());
        assert!(!hook.may(Action::Work) && hook.may(Action::Observe));
    }

    #[test]
    fn an_observation_source_is_reported_only_by_its_roles() {
        let hook = Caller {
            name: "hooks".into(),
            ..caller(&[(Role::Webhook, &["refunds"])])
        };
        let scope = observation_scope(Some(&hook), ObservationSource::Webhook).unwrap();
        assert!(scope.allows("refunds") && !scope.allows("payouts"));
        assert_eq!(
            observation_scope(Some(&hook), ObservationSource::Worker),
            Err(Refusal::RoleNotAllowed {
                caller: "hooks".into(),
                roles: "webhook".into(),
                method: "RecordObservation with source WORKER".into(),
                required: "worker".into(),
            })
        );
        assert!(observation_scope(None, ObservationSource::Worker)
            .unwrap()
            .is_any());
    }

    #[test]
    fn the_operator_recorded_is_the_credentials() {
        let alice = Caller {
            name: "alice".into(),
            ..caller(&[(Role::Operator, &["*"])])
        };
        assert_eq!(Refusal::operator_for(Some(&alice), "").unwrap(), "alice");
        assert_eq!(
            Refusal::operator_for(Some(&alice), "alice").unwrap(),
            "alice"
        );
        assert!(matches!(
            Refusal::operator_for(Some(&alice), "bob"),
            Err(Refusal::OperatorMismatch { .. })
        ));
        assert_eq!(Refusal::operator_for(None, "bob").unwrap(), "bob");
    }
}

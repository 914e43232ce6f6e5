//! The queues a caller may act on. Authentication (`crate::auth`) decides
//! who the caller is and which of its grants a call needs; the coordinator
//! and the store only ask a [`QueueScope`] whether it covers a queue, at
//! the point where the queue is known: the request's own `queue` field for
//! Enqueue and Claim, the job's row (read in the same transaction as the
//! write, under its lock) for every call that names a job by id. A job's
//! queue is set at enqueue and never changes, so the answer cannot go stale.

use super::CoordinatorError;
use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

/// Every queue, or a fixed set of them. Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum QueueScope {
    /// No restriction: a coordinator without authentication, an operator,
    /// or a grant on `*`.
    #[default]
    Any,
    /// Only these queues.
    Only(Arc<BTreeSet<String>>),
}

/// The unrestricted scope, for callers that need a reference to one.
pub static ANY_QUEUE: QueueScope = QueueScope::Any;

impl QueueScope {
    /// A scope of exactly these queues (`*` among them means every queue).
    pub fn of<I, S>(queues: I) -> QueueScope
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let set: BTreeSet<String> = queues.into_iter().map(Into::into).collect();
        if set.contains("*") {
            QueueScope::Any
        } else {
            QueueScope::Only(Arc::new(set))
        }
    }

    /// Whether a call on `queue` is inside the scope.
    pub fn allows(&self, queue: &str) -> bool {
        match self {
            QueueScope::Any => true,
            QueueScope::Only(set) => set.contains(queue),
        }
    }

    /// `Ok` when a call on `queue` (of job `job_id`, if it names one) is
    /// inside the scope, else [`CoordinatorError::QueueNotAllowed`].
    pub fn check(&self, queue: &str, job_id: Option<u64>) -> Result<(), CoordinatorError> {
        if self.allows(queue) {
            Ok(())
        } else {
            Err(CoordinatorError::QueueNotAllowed {
                queue: queue.to_owned(),
                job_id,
            })
        }
    }

    /// Whether the scope covers every queue (a request for "all queues",
    /// such as an events feed without a queue filter, needs this).
    pub fn is_any(&self) -> bool {
        matches!(self, QueueScope::Any)
    }

    /// The union of two scopes (a caller holding several grants).
    pub fn union(&self, other: &QueueScope) -> QueueScope {
        match (self, other) {
            (QueueScope::Any, _) | (_, QueueScope::Any) => QueueScope::Any,
            (QueueScope::Only(a), QueueScope::Only(b)) => {
                QueueScope::Only(Arc::new(a.union(b).cloned().collect()))
            }
        }
    }
}

impl fmt::Display for QueueScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueueScope::Any => f.write_str("*"),
            QueueScope::Only(set) => {
                let names: Vec<&str> = set.iter().map(String::as_str).collect();
                f.write_str(&names.join(","))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_allows_its_queues_only() {
        let refunds = QueueScope::of(["refunds"]);
        assert!(refunds.allows("refunds"));
        assert!(!refunds.allows("payouts"));
        assert!(!refunds.allows(""));
        assert!(QueueScope::of(["refunds", "*"]).is_any());
        assert!(QueueScope::Any.allows("anything"));
        let both = refunds.union(&QueueScope::of(["payouts"]));
        assert!(both.allows("payouts") && both.allows("refunds"));
        assert_eq!(both.to_string(), "payouts,refunds");
        assert!(both.union(&QueueScope::Any).is_any());
    }
}

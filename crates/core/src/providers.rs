//! The operator calls on providers and stored queue policies (docs/design.md
//! rules 11–13): checked here, stored in the database of the queues they
//! govern (so a claim's transaction reads them with its jobs), logged, and
//! waking the long-polling Claims a change may let through.

use super::Coordinator;
use jobfence_domain::budget::Pause;
use jobfence_domain::providers::{
    ChangeBy, PolicyChange, ProviderRecord, PutProvider, PutQueuePolicy, QueuePolicyRecord,
    SetPause,
};
use jobfence_domain::validate::{Violations, MAX_DELAY, MAX_ERROR_BYTES};
use jobfence_domain::{CoordinatorError, QueuePolicy};
use jobfence_store::JobStore;
use std::collections::BTreeSet;

/// Most dispatches a stored policy may allow.
pub const MAX_STORED_DISPATCHES: u32 = 1000;
/// Most changes one ListPolicyChanges returns.
pub const MAX_CHANGES_PAGE: u32 = 500;

pub(crate) fn check_by(v: &mut Violations, by: &ChangeBy) {
    v.key("operator", &by.operator);
    v.required("reason", &by.reason, "must say why (it is recorded)");
    v.max_bytes("reason", &by.reason, MAX_ERROR_BYTES);
}

/// Checks a stored resend policy's values (fields `resend_window`,
/// `max_dispatches`).
pub fn check_policy(v: &mut Violations, p: &QueuePolicy) {
    if p.resend_window.is_zero() {
        v.add(
            "resend_window",
            "must be positive (the provider's idempotency window, e.g. 24h)",
        );
    } else if p.resend_window > MAX_DELAY {
        v.add(
            "resend_window",
            format!("must be at most {}", humantime::format_duration(MAX_DELAY)),
        );
    }
    if p.max_dispatches == 0 || p.max_dispatches > MAX_STORED_DISPATCHES {
        v.add(
            "max_dispatches",
            format!("must be between 1 and {MAX_STORED_DISPATCHES}"),
        );
    }
}

impl Coordinator {
    /// Every provider of every database, by name.
    pub async fn list_providers(&self) -> Result<Vec<ProviderRecord>, CoordinatorError> {
        let mut out = Vec::new();
        for (_, store) in self.shards().all() {
            out.extend(store.list_providers().await?);
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The database holding provider `name`, if any.
    pub(crate) async fn provider_home(
        &self,
        name: &str,
    ) -> Result<Option<usize>, CoordinatorError> {
        for (i, (_, store)) in self.shards().all().iter().enumerate() {
            if store.get_provider(name).await?.is_some() {
                return Ok(Some(i));
            }
        }
        Ok(None)
    }

    async fn provider_store(&self, name: &str) -> Result<&JobStore, CoordinatorError> {
        let mut v = Violations::default();
        v.queue("name", name);
        v.finish()?;
        match self.provider_home(name).await? {
            Some(i) => Ok(self.shards().at(i)),
            None => Err(CoordinatorError::invalid(
                "name",
                format!("no provider is named {name:?}"),
            )),
        }
    }

    /// Reads provider `name` back after a change.
    async fn provider_after(
        &self,
        store: &JobStore,
        name: &str,
    ) -> Result<ProviderRecord, CoordinatorError> {
        store.get_provider(name).await?.ok_or_else(|| {
            CoordinatorError::Internal(format!("provider {name:?} vanished after its change"))
        })
    }

    /// Waits are over for the queues of `p`: a change may let jobs through.
    fn wake(&self, p: &ProviderRecord) {
        for q in &p.queues {
            self.pipelines.waiters.work_available(q);
        }
    }

    /// PutProvider: creates a provider or replaces its budget and queues.
    /// Every problem is a field violation, nothing written: the name, the
    /// budget (see [`jobfence_domain::budget::Budget::violations`]), a queue
    /// name, a queue listed twice or given to another provider already,
    /// queues on several databases, the operator and reason. Returns the
    /// provider as stored and whether it was created.
    pub async fn put_provider(
        &self,
        req: PutProvider,
    ) -> Result<(ProviderRecord, bool), CoordinatorError> {
        let mut v = Violations::default();
        v.queue("name", &req.name);
        v.0.extend(req.budget.violations("budget."));
        let mut seen = BTreeSet::new();
        let mut homes = BTreeSet::new();
        for (i, q) in req.queues.iter().enumerate() {
            let field = format!("queues[{i}]");
            v.queue(&field, q);
            if !seen.insert(q.as_str()) {
                v.add(&field, format!("queue {q:?} is listed twice"));
            }
            if let Ok(d) = self.shards().index_for_queue(q) {
                homes.insert(d);
            }
        }
        check_by(&mut v, &req.by);
        if homes.len() > 1 {
            v.add(
                "queues",
                "the queues live on different databases: a provider's budget is one row, spent in each claim's own transaction, so its queues must share a database",
            );
        }
        v.finish()?;
        let existing = self.provider_home(&req.name).await?;
        let home = match (existing, homes.first().copied()) {
            (Some(e), Some(h)) if e != h => {
                return Err(CoordinatorError::invalid(
                    "queues",
                    format!(
                        "provider {:?} is stored on database {e} and these queues live on database {h}: delete it and create it again",
                        req.name
                    ),
                ))
            }
            (Some(e), _) => e,
            (None, Some(h)) => h,
            (None, None) => 0,
        };
        let store = self.shards().at(home);
        let created = store.put_provider(&req).await?;
        let after = self.provider_after(store, &req.name).await?;
        tracing::warn!(
            provider = %req.name,
            operator = %req.by.operator.escape_debug(),
            reason = %req.by.reason.escape_debug(),
            rate_per_second = req.budget.rate_per_second,
            burst = req.budget.burst,
            max_in_flight = ?req.budget.max_in_flight,
            queues = ?after.queues,
            created,
            "provider budget stored"
        );
        self.wake(&after);
        Ok((after, created))
    }

    /// DeleteProvider: its queues are unlimited again. Returns it as it was.
    pub async fn delete_provider(
        &self,
        name: &str,
        by: ChangeBy,
    ) -> Result<ProviderRecord, CoordinatorError> {
        let mut v = Violations::default();
        check_by(&mut v, &by);
        v.finish()?;
        let store = self.provider_store(name).await?;
        let before = store.delete_provider(name, &by).await?;
        tracing::warn!(
            provider = %name,
            operator = %by.operator.escape_debug(),
            reason = %by.reason.escape_debug(),
            queues = ?before.queues,
            "provider deleted: its queues are unlimited"
        );
        self.wake(&before);
        Ok(before)
    }

    /// PauseProvider (`Pause::All`, `Pause::Sends`) and ResumeProvider
    /// (`Pause::None`; it also ends a reported throttle). Stored: every
    /// coordinator holds the hand-outs from its next claim on.
    pub async fn set_provider_pause(
        &self,
        req: SetPause,
    ) -> Result<ProviderRecord, CoordinatorError> {
        let mut v = Violations::default();
        check_by(&mut v, &req.by);
        v.finish()?;
        let store = self.provider_store(&req.name).await?;
        store.set_pause(&req).await?;
        let after = self.provider_after(store, &req.name).await?;
        match req.pause {
            Pause::None => tracing::warn!(
                provider = %req.name,
                operator = %req.by.operator.escape_debug(),
                reason = %req.by.reason.escape_debug(),
                "provider resumed"
            ),
            p => tracing::warn!(
                provider = %req.name,
                pause = p.as_str(),
                operator = %req.by.operator.escape_debug(),
                reason = %req.by.reason.escape_debug(),
                "provider paused"
            ),
        }
        self.wake(&after);
        Ok(after)
    }

    /// PutQueuePolicy: the queue's resend policy, stored where the queue
    /// lives; it wins over this and every coordinator's flags.
    pub async fn put_queue_policy(
        &self,
        req: PutQueuePolicy,
    ) -> Result<QueuePolicyRecord, CoordinatorError> {
        let mut v = Violations::default();
        v.queue("queue", &req.queue);
        check_policy(&mut v, &req.policy);
        if let Some(d) = req.job_retention {
            if d < jobfence_domain::retention::MIN_RETENTION {
                v.add("job_retention", "must be at least 1s when set");
            }
        }
        check_by(&mut v, &req.by);
        v.finish()?;
        let store = self.shards().at(self.shards().index_for_queue(&req.queue)?);
        store.put_queue_policy(&req).await?;
        tracing::warn!(
            queue = %req.queue,
            operator = %req.by.operator.escape_debug(),
            reason = %req.by.reason.escape_debug(),
            resend_window_secs = req.policy.resend_window.as_secs(),
            max_dispatches = req.policy.max_dispatches,
            "queue policy stored"
        );
        self.stored_policy_of(store, &req.queue).await
    }

    async fn stored_policy_of(
        &self,
        store: &JobStore,
        queue: &str,
    ) -> Result<QueuePolicyRecord, CoordinatorError> {
        store
            .list_queue_policies()
            .await?
            .into_iter()
            .find(|p| p.queue == queue)
            .ok_or_else(|| {
                CoordinatorError::Internal(format!(
                    "the policy of {queue:?} vanished after its change"
                ))
            })
    }

    /// DeleteQueuePolicy: the flags decide the queue's resends again.
    pub async fn delete_queue_policy(
        &self,
        queue: &str,
        by: ChangeBy,
    ) -> Result<QueuePolicyRecord, CoordinatorError> {
        let mut v = Violations::default();
        v.queue("queue", queue);
        check_by(&mut v, &by);
        v.finish()?;
        let store = self.shards().at(self.shards().index_for_queue(queue)?);
        let before = store.delete_queue_policy(queue, &by).await?;
        tracing::warn!(
            queue = %queue,
            operator = %by.operator.escape_debug(),
            reason = %by.reason.escape_debug(),
            "queue policy deleted: the coordinators' flags apply"
        );
        Ok(before)
    }

    /// Every queue with a stored policy or a provider, by queue.
    pub async fn list_queue_policies(&self) -> Result<Vec<QueuePolicyRecord>, CoordinatorError> {
        let mut out = Vec::new();
        for (_, store) in self.shards().all() {
            out.extend(store.list_queue_policies().await?);
        }
        out.sort_by(|a, b| a.queue.cmp(&b.queue));
        Ok(out)
    }

    /// The recorded changes, newest first (`limit` 0 means 50).
    pub async fn list_policy_changes(
        &self,
        subject: Option<&str>,
        before: Option<u64>,
        limit: u32,
    ) -> Result<Vec<PolicyChange>, CoordinatorError> {
        let limit = match limit {
            0 => 50,
            n if n > MAX_CHANGES_PAGE => {
                return Err(CoordinatorError::invalid(
                    "limit",
                    format!("must be at most {MAX_CHANGES_PAGE}"),
                ))
            }
            n => n,
        };
        let mut out = Vec::new();
        for (_, store) in self.shards().all() {
            out.extend(store.list_policy_changes(subject, before, limit).await?);
        }
        out.sort_by(|a, b| b.changed_at.cmp(&a.changed_at).then(b.id.cmp(&a.id)));
        out.truncate(limit as usize);
        Ok(out)
    }

    /// Logs a warning for every stored queue policy that differs from
    /// what this coordinator's flags would apply to that queue: the stored
    /// one wins (docs/design.md rule 13), so the flag is misleading. Returns
    /// the queues warned about.
    pub async fn warn_flags_differ_from_stored(&self) -> Result<Vec<String>, CoordinatorError> {
        let mut differ = Vec::new();
        for stored in self.list_queue_policies().await? {
            let Some(p) = stored.policy else { continue };
            let flags = self.config().policies.get(&stored.queue);
            if flags != p {
                tracing::warn!(
                    queue = %stored.queue,
                    stored_resend_window_secs = p.resend_window.as_secs(),
                    stored_max_dispatches = p.max_dispatches,
                    flag_resend_window_secs = flags.resend_window.as_secs(),
                    flag_max_dispatches = flags.max_dispatches,
                    stored_by = %stored.updated_by.escape_debug(),
                    "this coordinator's --resend-window / --max-dispatches flags differ from the queue's stored policy; the stored policy applies"
                );
                differ.push(stored.queue);
            }
        }
        Ok(differ)
    }
}

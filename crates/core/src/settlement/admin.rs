//! Settlement's other calls: storing a provider's settings, its report at
//! a glance, the exceptions and a person's action on one. Validation
//! first; every refusal a field violation.

use crate::Coordinator;
use jobfence_domain::settlement::mapping::{Mapping, PRESETS};
use jobfence_domain::settlement::records::{
    ActOnException, ExceptionList, ProviderSettlement, PutSettlementSettings, SettlementException,
    SettlementSettings,
};
use jobfence_domain::settlement::{ExceptionState, SettlementLine};
use jobfence_domain::validate::{Violations, MAX_ERROR_BYTES};
use jobfence_domain::CoordinatorError;
use std::time::Duration;

/// The longest settlement lag accepted (a report a month late is no
/// report).
pub const MAX_LAG: Duration = Duration::from_secs(31 * 24 * 3600);
/// Most exceptions one list returns.
pub const MAX_EXCEPTIONS: u32 = 500;

/// Checks a mapping's columns: none empty, none longer than a column name
/// may be.
fn check_mapping(v: &mut Violations, m: &Mapping) {
    for (field, column) in m.columns() {
        let field = format!("columns.{field}");
        v.required(&field, column, "must name the report's column");
        v.max_bytes(&field, column, 255);
    }
}

impl Coordinator {
    /// Stores a provider's settlement settings (see
    /// [`jobfence_store::JobStore::put_settlement_settings`]); the
    /// provider's database is the one holding the provider.
    pub async fn put_settlement_settings(
        &self,
        req: PutSettlementSettings,
    ) -> Result<SettlementSettings, CoordinatorError> {
        let mut v = Violations::default();
        v.key("operator", &req.by.operator);
        v.required("reason", &req.by.reason, "must say why (it is recorded)");
        v.max_bytes("reason", &req.by.reason, MAX_ERROR_BYTES);
        let unknown_preset = req
            .preset
            .as_ref()
            .is_some_and(|p| !PRESETS.contains(&p.as_str()));
        if unknown_preset {
            v.add("preset", format!("must be one of {}", PRESETS.join(", ")));
        } else {
            // An unknown preset gave no columns: each would be refused
            // again, for the preset's fault.
            check_mapping(&mut v, &req.mapping);
        }
        if req.lag > MAX_LAG {
            v.add("lag", "must be at most 31 days");
        }
        for (i, q) in req.queues.iter().enumerate() {
            for (name, pointer) in [
                ("amount_pointer", &q.amount_pointer),
                ("currency_pointer", &q.currency_pointer),
            ] {
                if let Some(p) = pointer {
                    if !p.starts_with('/') {
                        v.add(
                            &format!("queues[{i}].{name}"),
                            "must be a JSON pointer (RFC 6901), e.g. /amount",
                        );
                    }
                }
            }
        }
        v.finish()?;
        let Some(home) = self.provider_home(&req.provider).await? else {
            return Err(CoordinatorError::invalid(
                "provider",
                format!(
                    "no provider {:?} (create it with `jobfence providers set`)",
                    req.provider
                ),
            ));
        };
        let store = self.shards().at(home);
        store.put_settlement_settings(&req).await?;
        store
            .settlement_settings(&req.provider)
            .await?
            .ok_or_else(|| CoordinatorError::Internal("settlement settings vanished".into()))
    }

    /// Each provider's settlement (or only `provider`'s), with its
    /// settings.
    pub async fn settlement_reports(
        &self,
        provider: Option<&str>,
    ) -> Result<Vec<(SettlementSettings, ProviderSettlement)>, CoordinatorError> {
        let mut out = Vec::new();
        if let Some(p) = provider {
            let (store, settings) = self.settlement_home(p).await?;
            let report = store.provider_settlement(&settings).await?;
            out.push((settings, report));
            return Ok(out);
        }
        for (_, store) in self.shards().all() {
            for name in store.settlement_providers().await? {
                if let Some(settings) = store.settlement_settings(&name).await? {
                    let report = store.provider_settlement(&settings).await?;
                    out.push((settings, report));
                }
            }
        }
        Ok(out)
    }

    /// Exceptions of every database, newest first: of `provider`, in
    /// `states` (open and acknowledged when empty), of `job_id`; at most
    /// `limit` (1 to [`MAX_EXCEPTIONS`]; 0 means 100), with how many
    /// match in all (`total`), so that a list cut at its limit can say so.
    pub async fn settlement_exceptions(
        &self,
        provider: Option<&str>,
        states: &[ExceptionState],
        job_id: Option<u64>,
        limit: u32,
    ) -> Result<ExceptionList, CoordinatorError> {
        if limit > MAX_EXCEPTIONS {
            return Err(CoordinatorError::invalid(
                "limit",
                format!("must be at most {MAX_EXCEPTIONS} (0 means 100)"),
            ));
        }
        let limit = if limit == 0 { 100 } else { limit };
        let states = if states.is_empty() {
            vec![ExceptionState::Open, ExceptionState::Acknowledged]
        } else {
            states.to_vec()
        };
        let mut out = ExceptionList::default();
        for (_, store) in self.shards().all() {
            out.exceptions.extend(
                store
                    .list_settlement_exceptions(provider, &states, job_id, limit)
                    .await?,
            );
            out.total += store
                .count_settlement_exceptions(provider, &states, job_id)
                .await?;
        }
        out.exceptions
            .sort_by(|a, b| b.updated_at.cmp(&a.updated_at).then(b.id.cmp(&a.id)));
        out.exceptions.truncate(limit as usize);
        // Counted apart from the list: an exception raised between the
        // two reads is in the count only; never fewer than shown.
        out.total = out.total.max(out.exceptions.len() as u64);
        Ok(out)
    }

    /// A job's settlement: the report lines of its key (by provider), and
    /// its exceptions (every state), for its page.
    pub async fn job_settlement(
        &self,
        job: &jobfence_domain::Job,
    ) -> Result<(Vec<(String, SettlementLine)>, Vec<SettlementException>), CoordinatorError> {
        let store = self.shards().for_job(job.id)?;
        let lines = store
            .settlement_lines_of(&job.queue, &job.operation_key)
            .await?;
        let all = [
            ExceptionState::Open,
            ExceptionState::Acknowledged,
            ExceptionState::Resolved,
        ];
        let exceptions = store
            .list_settlement_exceptions(None, &all, Some(job.id), MAX_EXCEPTIONS)
            .await?;
        Ok((lines, exceptions))
    }

    /// One exception with its life, from whichever database holds it.
    pub async fn settlement_exception(
        &self,
        id: u64,
    ) -> Result<SettlementException, CoordinatorError> {
        for (_, store) in self.shards().all() {
            if let Some(e) = store.settlement_exception(id).await? {
                return Ok(e);
            }
        }
        Err(CoordinatorError::SettlementExceptionNotFound { id })
    }

    /// A person's action on an exception. Errors: `InvalidArgument` for a
    /// move that is not open → acknowledged or (open | acknowledged) →
    /// resolved, or a missing note or name; `SettlementExceptionNotFound`
    /// for an id no database holds; `SettlementExceptionMoved` for an
    /// exception no longer in the state seen (someone acted first).
    pub async fn act_on_settlement_exception(
        &self,
        act: ActOnException,
    ) -> Result<SettlementException, CoordinatorError> {
        let mut v = Violations::default();
        v.key("operator", &act.operator);
        v.required("note", &act.note, "must say what was done (it is recorded)");
        v.max_bytes("note", &act.note, MAX_ERROR_BYTES);
        let allowed = matches!(
            (act.seen, act.to),
            (ExceptionState::Open, ExceptionState::Acknowledged)
                | (ExceptionState::Open, ExceptionState::Resolved)
                | (ExceptionState::Acknowledged, ExceptionState::Resolved)
        );
        if !allowed {
            let why = match act.seen {
                ExceptionState::Open => format!(
                    "an open exception is acknowledged or resolved, not made {}",
                    act.to.as_str()
                ),
                ExceptionState::Acknowledged => format!(
                    "an acknowledged exception can only be resolved, not made {}",
                    act.to.as_str()
                ),
                ExceptionState::Resolved => {
                    "the exception is resolved already, and nothing changes a resolved one".into()
                }
            };
            v.add("to_state", why);
        }
        v.finish()?;
        let held = self.settlement_exception(act.id).await?;
        let store = self.settlement_home(&held.provider).await?.0;
        let done = store.act_on_settlement_exception(&act).await?;
        self.refresh_settlement_gauges().await;
        tracing::info!(
            exception = act.id,
            kind = done.kind.as_str(),
            subject = %done.subject.escape_debug(),
            state = done.state.as_str(),
            operator = %act.operator.escape_debug(),
            "settlement exception acted on"
        );
        Ok(done)
    }
}

//! Applying what a key's lines decide: a manual review resolved through
//! the operator's fenced resolution (recorded as `settlement`), a live job
//! given the line as an observation, exceptions raised and cleared; then
//! the lines marked decided.

use crate::Coordinator;
use jobfence_domain::admin::{Resolution, ResolveManualReview};
use jobfence_domain::settlement::held::decide_held;
use jobfence_domain::settlement::records::{SettlementSettings, Tally};
use jobfence_domain::settlement::{
    clearable, ExceptionKind, Holder, Outcome, SettlementLine, OPERATOR,
};
use jobfence_domain::{CoordinatorError, ObservationOutcome, ObservationSource, RecordObservation};
use jobfence_store::settlement::{KeyLines, Raised};
use jobfence_store::JobStore;

/// How many times a key is decided again after its job moved under the
/// decision (a worker completed it, an operator resolved it first).
const REDECIDE: usize = 3;

/// Decides and applies every key of `batch`. Reads who holds the keys and
/// which have exceptions not resolved (two statements for the batch);
/// writes only where something changes (a resolution, an observation, an
/// exception raised or cleared); marks the batch's lines decided at once.
pub(super) async fn apply(
    coordinator: &Coordinator,
    store: &JobStore,
    settings: &SettlementSettings,
    batch: &[KeyLines],
) -> Result<Tally, CoordinatorError> {
    let keys: Vec<&str> = batch.iter().filter_map(|k| k.key.as_deref()).collect();
    let mut holders = store.settlement_holders(&settings.queues, &keys).await?;
    let subjects: Vec<String> = batch.iter().map(subject_of).collect();
    let asked: Vec<&str> = subjects
        .iter()
        .map(String::as_str)
        .chain(batch.iter().flat_map(references_of))
        .collect();
    let with_exceptions = store
        .unresolved_subjects(&settings.provider, &asked)
        .await?;
    let mut out = Tally::default();
    for (kl, subject) in batch.iter().zip(&subjects) {
        let lines: Vec<SettlementLine> = kl.lines.iter().map(|(_, l)| l.clone()).collect();
        for round in 0..=REDECIDE {
            let held = kl
                .key
                .as_ref()
                .and_then(|k| holders.get(k))
                .map_or(&[][..], Vec::as_slice);
            let (h, d) = decide_held(&settings.queues, held, &lines);
            match apply_one(coordinator, store, settings, &h, &d.outcome, &lines).await? {
                Applied::Done => {}
                // The job moved under the decision: read it again.
                Applied::Moved if round < REDECIDE => {
                    if let Some(k) = &kl.key {
                        let again = store.settlement_holders(&settings.queues, &[k]).await?;
                        holders.extend(again);
                    }
                    continue;
                }
                Applied::Moved => {}
            }
            out.count(&d.outcome);
            if d.exceptions.is_empty() && !with_exceptions.contains(subject) {
                break;
            }
            let raised: Vec<Raised> = d
                .exceptions
                .iter()
                .map(|(kind, detail)| Raised {
                    kind: *kind,
                    job_id: h.job_id(),
                    detail: detail.clone(),
                })
                .collect();
            let done = store
                .raise_settlement_exceptions(
                    &settings.provider,
                    subject,
                    &raised,
                    &clearable(&lines),
                )
                .await?;
            out.exceptions_opened += done.opened;
            out.exceptions_resolved += done.resolved;
            break;
        }
        out.exceptions_resolved +=
            clear_unknown_references(store, &settings.provider, kl, &with_exceptions).await?;
    }
    mark_decided(store, batch).await?;
    Ok(out)
}

/// A key's subject: its operation key, or a keyless line's reference.
fn subject_of(kl: &KeyLines) -> String {
    match &kl.key {
        Some(k) => k.clone(),
        None => kl.lines[0].1.provider_reference.clone(),
    }
}

/// The provider references of a key's lines, when it has a key: the
/// subjects their refunds had while they had none.
fn references_of(kl: &KeyLines) -> impl Iterator<Item = &str> {
    kl.lines
        .iter()
        .filter(|_| kl.key.is_some())
        .map(|(_, l)| l.provider_reference.as_str())
}

/// Resolves the UNKNOWN_REFERENCE a line of `kl` was filed under by its
/// provider reference while it had no key: once the line has one (the
/// report gives it, or a job recorded the reference since), the refund
/// is known and decided under its key. The exceptions resolved.
async fn clear_unknown_references(
    store: &JobStore,
    provider: &str,
    kl: &KeyLines,
    with_exceptions: &std::collections::HashSet<String>,
) -> Result<u64, CoordinatorError> {
    let mut resolved = 0;
    for reference in references_of(kl).filter(|r| with_exceptions.contains(*r)) {
        if kl.key.as_deref() == Some(reference) {
            continue;
        }
        let done = store
            .raise_settlement_exceptions(
                provider,
                reference,
                &[],
                &[ExceptionKind::UnknownReference],
            )
            .await?;
        resolved += done.resolved;
    }
    Ok(resolved)
}

/// Marks the batch's lines decided, one statement per moment they were
/// read at (the lines of keys in one, each keyless line in its own).
async fn mark_decided(store: &JobStore, batch: &[KeyLines]) -> Result<(), CoordinatorError> {
    let mut by_read: std::collections::BTreeMap<jobfence_domain::DbTime, Vec<u64>> =
        Default::default();
    for kl in batch {
        by_read
            .entry(kl.read_at)
            .or_default()
            .extend(kl.lines.iter().map(|(id, _)| *id));
    }
    for (read_at, ids) in by_read {
        store.settlement_lines_decided(&ids, read_at).await?;
    }
    Ok(())
}

enum Applied {
    Done,
    /// The job was not where the decision read it: decide again.
    Moved,
}

async fn apply_one(
    coordinator: &Coordinator,
    store: &JobStore,
    settings: &SettlementSettings,
    h: &Holder,
    outcome: &Outcome,
    lines: &[SettlementLine],
) -> Result<Applied, CoordinatorError> {
    let settled = lines.iter().find(|l| l.status.moved_money());
    match (outcome, settled, h) {
        (
            Outcome::Resolve {
                job_id,
                attempt,
                provider_reference,
            },
            Some(line),
            _,
        ) => {
            observe(store, settings, *job_id, *attempt, line).await?;
            let resolved = coordinator
                .resolve_manual_review(
                    ResolveManualReview {
                        job_id: *job_id,
                        attempt: *attempt,
                        resolution: Resolution::Succeeded {
                            provider_reference: provider_reference.clone(),
                            result: Some(line_body(&settings.provider, line)),
                        },
                        operator: OPERATOR.into(),
                        reason: format!(
                            "settled in {}'s report: refund {} of {} {}",
                            settings.provider,
                            line.provider_reference,
                            line.amount_minor,
                            line.currency
                        ),
                    },
                    false,
                )
                .await;
            match resolved {
                // A replay: another import of the same report resolved it
                // first with the same line; it counts there, and here the
                // key is decided again (matched).
                Ok(out) if out.replayed => Ok(Applied::Moved),
                Ok(_) => Ok(Applied::Done),
                // Fenced like an operator's: a worker or an operator moved
                // the job first, and nothing was written.
                Err(
                    CoordinatorError::JobNotInManualReview { .. }
                    | CoordinatorError::AttemptSuperseded { .. },
                ) => Ok(Applied::Moved),
                Err(e) => Err(e),
            }
        }
        (Outcome::Observe { job_id }, Some(line), Holder::Job { attempt, .. }) => {
            observe(store, settings, *job_id, *attempt, line).await?;
            Ok(Applied::Done)
        }
        _ => Ok(Applied::Done),
    }
}

/// The line as an observation's body (JSON).
fn line_body(provider: &str, l: &SettlementLine) -> String {
    serde_json::json!({
        "provider": provider,
        "provider_reference": l.provider_reference,
        "operation_key": l.operation_key,
        "amount_minor": l.amount_minor,
        "currency": l.currency,
        "status": l.status.as_str(),
        "created": l.created_at.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
    })
    .to_string()
}

/// Keeps a settled line as evidence on the job (de-duplicated per refund).
async fn observe(
    store: &JobStore,
    settings: &SettlementSettings,
    job_id: u64,
    attempt: u64,
    line: &SettlementLine,
) -> Result<(), CoordinatorError> {
    let req = RecordObservation {
        job_id,
        attempt,
        source: ObservationSource::Settlement,
        outcome: ObservationOutcome::Succeeded,
        provider_reference: Some(line.provider_reference.clone()),
        body: line_body(&settings.provider, line),
        dedup_key: format!(
            "settlement:{}:{}",
            settings.provider, line.provider_reference
        ),
    };
    match store
        .record_observation(&req, &jobfence_domain::scope::ANY_QUEUE)
        .await
    {
        Ok(_) => Ok(()),
        // Pruned meanwhile: the key record still matches; nothing to keep
        // the line on.
        Err(CoordinatorError::JobPruned(_) | CoordinatorError::JobNotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

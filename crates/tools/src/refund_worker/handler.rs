//! The refund protocol of one job, on the worker SDK and the provider
//! client. Every decision follows the seed: an unknown outcome is
//! reconciled, never taken for "not refunded"; "not found" at the provider
//! is not proof, so a resend is only *asked for* (Fail with RETRY_EXECUTE)
//! and the coordinator allows it only inside the resend window. A `429`
//! from the provider is reported with the Fail (`provider_retry_after`), so
//! the coordinator holds every worker's hand-outs for that provider until
//! its Retry-After (docs/design.md rule 11): no worker keeps a rate limiter.
//!
//! One hand-out makes at most one provider call for an EXECUTE (the send,
//! or the check of evidence handed over with it) and two for a RECONCILE
//! (the check of evidence, then the lookup): the costs a provider budget
//! must charge this worker's queue so that the budget bounds the calls
//! (`jobfence demo` puts execute 1, reconcile 2).

use jobfence_domain::budget::MAX_PROVIDER_RETRY_AFTER;
use jobfence_fake_provider::{ProviderClient, ProviderError, Refund, RefundParams, RefundStatus};
use jobfence_worker::proto::{NextAction, ObservationOutcome};
use jobfence_worker::{ClaimedJob, Disposition, Handler, HandlerError, WriteError};
use serde::Deserialize;
use std::time::Duration;

/// The payload of a refund job.
#[derive(Debug, Deserialize)]
struct RefundPayload {
    payment_id: String,
    amount: i64,
    currency: String,
}

/// Timings of the refund handler.
#[derive(Debug, Clone)]
pub struct RefundTimings {
    /// How long one provider call may take before its outcome counts as
    /// unknown.
    pub provider_timeout: Duration,
    /// When a pending or unknown refund is looked at again.
    pub reconcile_delay: Duration,
    /// When a refund the provider certainly did not make (503) is sent again.
    pub resend_delay: Duration,
}

impl Default for RefundTimings {
    fn default() -> Self {
        RefundTimings {
            provider_timeout: Duration::from_secs(2),
            reconcile_delay: Duration::from_secs(1),
            resend_delay: Duration::from_millis(500),
        }
    }
}

/// Handles refund jobs against a provider.
#[derive(Debug, Clone)]
pub struct RefundHandler {
    provider: ProviderClient,
    timings: RefundTimings,
    /// Test hook: after the provider answers (or fails) a create for this
    /// operation_key, the process stops itself with SIGSTOP — the seed's
    /// "zombie" frozen between sending the refund and writing back.
    freeze_after_send: Option<String>,
}

/// What to write back.
enum Outcome {
    Complete(Refund),
    Fail(Disposition, String, Duration),
    /// The provider pushed back (429) and did nothing: Fail with this
    /// disposition, due again after the Retry-After, which is also reported
    /// to the coordinator as `provider_retry_after`.
    Throttled(Disposition, String, Duration),
}

/// The Retry-After assumed when a 429 came without one.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// What the evidence handed over with a claim showed ([`RefundHandler::check_evidence`]).
enum Evidence {
    /// No success with a provider reference was observed.
    None,
    /// The provider confirmed it: a succeeded refund of this operation_key.
    Verified(Refund),
    /// The lookup of this reference did not confirm it (not found yet,
    /// another refund, an error).
    Unconfirmed(String),
    /// The provider's rate limit refused the lookup.
    Throttled(Option<Duration>),
}

/// A 429 to a call whose job would be disposed of with `disposition`: the
/// provider did nothing, so the job goes back as it was, due after the
/// provider's Retry-After (clamped to what the coordinator accepts).
fn throttled(disposition: Disposition, call: &str, retry_after: Option<Duration>) -> Outcome {
    let wait = retry_after
        .unwrap_or(DEFAULT_RETRY_AFTER)
        .clamp(Duration::from_millis(1), MAX_PROVIDER_RETRY_AFTER);
    Outcome::Throttled(
        disposition,
        format!(
            "provider rate limit (429) on the {call}: nothing was done; retry after {}",
            humantime::format_duration(wait)
        ),
        wait,
    )
}

impl RefundHandler {
    pub fn new(provider: ProviderClient, timings: RefundTimings) -> Self {
        RefundHandler {
            provider,
            timings,
            freeze_after_send: std::env::var("JOBFENCE_TEST_FREEZE_AFTER_SEND").ok(),
        }
    }

    fn params(job: &ClaimedJob) -> Result<RefundParams, String> {
        let p: RefundPayload =
            serde_json::from_str(job.payload()).map_err(|e| format!("bad refund payload: {e}"))?;
        Ok(RefundParams {
            payment_id: p.payment_id,
            amount: p.amount,
            currency: p.currency,
            // The merchant reference is how a reconcile finds the refund.
            merchant_reference: job.operation_key().to_owned(),
        })
    }

    /// EXECUTE: send the refund with operation_key as idempotency key.
    async fn execute(&self, job: &ClaimedJob, params: &RefundParams) -> Outcome {
        let sent = self
            .provider
            .create_refund(job.operation_key(), params, self.timings.provider_timeout)
            .await;
        if self.freeze_after_send.as_deref() == Some(job.operation_key()) {
            tracing::warn!(
                job_id = job.job_id(),
                attempt = job.attempt(),
                "test hook: freezing after send"
            );
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
        }
        let t = &self.timings;
        match sent {
            Ok(refund) => self.settled(refund),
            // Refused before anything was done: the same send, later.
            Err(ProviderError::RateLimited { retry_after, .. }) => {
                throttled(Disposition::RetryExecute, "send", retry_after)
            }
            Err(e) if e.refund_may_exist() => Outcome::Fail(
                Disposition::RetryReconcile,
                format!("outcome unknown, reconcile: {e}"),
                t.reconcile_delay,
            ),
            Err(e @ ProviderError::Unavailable { .. }) => Outcome::Fail(
                Disposition::RetryExecute,
                format!("provider did nothing: {e}"),
                t.resend_delay,
            ),
            Err(e) => Outcome::Fail(
                Disposition::ManualReview,
                format!("provider refused: {e}"),
                Duration::ZERO,
            ),
        }
    }

    /// RECONCILE: ask the provider what happened, by merchant reference.
    async fn reconcile(&self, job: &ClaimedJob) -> Outcome {
        let t = &self.timings;
        let found = match self
            .provider
            .find_by_merchant_reference(job.operation_key(), t.provider_timeout)
            .await
        {
            Ok(found) => found,
            Err(ProviderError::RateLimited { retry_after, .. }) => {
                return throttled(Disposition::RetryReconcile, "lookup", retry_after)
            }
            Err(e) => {
                return Outcome::Fail(
                    Disposition::RetryReconcile,
                    format!("lookup failed: {e}"),
                    t.reconcile_delay,
                )
            }
        };
        if let Some(r) = found.iter().find(|r| r.status == RefundStatus::Succeeded) {
            return Outcome::Complete(r.clone());
        }
        if found.iter().any(|r| r.status == RefundStatus::Pending) {
            return Outcome::Fail(
                Disposition::RetryReconcile,
                "refund pending".into(),
                t.reconcile_delay,
            );
        }
        if !found.is_empty() {
            return Outcome::Fail(
                Disposition::Failed,
                "the provider failed the refund".into(),
                Duration::ZERO,
            );
        }
        // Not found is not proof (lag, a request still queued): ask for a
        // resend with the same key; the coordinator allows it only inside
        // the provider's idempotency window, else parks the job.
        Outcome::Fail(
            Disposition::RetryExecute,
            "not found at the provider; resend with the same idempotency key".into(),
            t.resend_delay,
        )
    }

    /// Evidence handed over with the claim (a late success of a stale
    /// worker, a webhook): the newest success with a provider reference,
    /// checked with **one** lookup, never more, whatever the number of
    /// observations: every provider call a hand-out can cause must be paid
    /// for by its cost in the provider's budget (docs/design.md rule 11), and a
    /// lookup per observation had no bound.
    async fn check_evidence(&self, job: &ClaimedJob) -> Evidence {
        let Some(o) = job.observations().iter().rev().find(|o| {
            o.outcome == ObservationOutcome::Succeeded as i32 && !o.provider_reference.is_empty()
        }) else {
            return Evidence::None;
        };
        match self
            .provider
            .get_refund(&o.provider_reference, self.timings.provider_timeout)
            .await
        {
            Ok(Some(r))
                if r.status == RefundStatus::Succeeded
                    && r.merchant_reference == job.operation_key() =>
            {
                Evidence::Verified(r)
            }
            Err(ProviderError::RateLimited { retry_after, .. }) => Evidence::Throttled(retry_after),
            _ => Evidence::Unconfirmed(o.provider_reference.clone()),
        }
    }

    fn settled(&self, refund: Refund) -> Outcome {
        match refund.status {
            RefundStatus::Succeeded => Outcome::Complete(refund),
            RefundStatus::Pending => Outcome::Fail(
                Disposition::RetryReconcile,
                format!("refund {} pending", refund.id),
                self.timings.reconcile_delay,
            ),
            RefundStatus::Failed => Outcome::Fail(
                Disposition::Failed,
                format!("the provider failed refund {}", refund.id),
                Duration::ZERO,
            ),
        }
    }
}

impl Handler for RefundHandler {
    async fn handle(&self, job: &mut ClaimedJob) -> Result<(), HandlerError> {
        let outcome = match Self::params(job) {
            Err(why) => Outcome::Fail(Disposition::ManualReview, why, Duration::ZERO),
            Ok(params) => match (self.check_evidence(job).await, job.next_action()) {
                (Evidence::Verified(refund), _) => Outcome::Complete(refund),
                // A refused lookup is never turned into a send.
                (Evidence::Throttled(retry_after), _) => {
                    throttled(Disposition::RetryReconcile, "lookup", retry_after)
                }
                (Evidence::None | Evidence::Unconfirmed(_), NextAction::Reconcile) => {
                    self.reconcile(job).await
                }
                // Someone saw this refund succeed, and the lookup could not
                // confirm it (lag, a 503): reconcile rather than send, so
                // this hand-out makes one provider call, not two.
                (Evidence::Unconfirmed(reference), _) => Outcome::Fail(
                    Disposition::RetryReconcile,
                    format!("evidence of refund {reference} not confirmed yet; reconcile before any send"),
                    self.timings.reconcile_delay,
                ),
                (Evidence::None, _) => self.execute(job, &params).await,
            },
        };
        let written = match outcome {
            Outcome::Complete(refund) => {
                let result = serde_json::to_string(&refund).unwrap_or_default();
                job.complete_or_observe(&refund.id, &result)
                    .await
                    .map(|_| ())
            }
            Outcome::Fail(d, why, delay) => job.fail(d, &why, delay).await.map(|_| ()),
            Outcome::Throttled(d, why, retry_after) => {
                tracing::info!(
                    job_id = job.job_id(),
                    attempt = job.attempt(),
                    retry_after_ms = retry_after.as_millis() as u64,
                    "provider rate limit: reporting its retry-after"
                );
                job.fail_throttled(d, &why, retry_after, retry_after)
                    .await
                    .map(|_| ())
            }
        };
        match written {
            Ok(()) => Ok(()),
            // Someone else holds the job now; the SDK kept any provider
            // result as an observation. Nothing more to do here.
            Err(e @ (WriteError::Superseded { .. } | WriteError::NotRunning { .. })) => {
                tracing::info!(job_id = job.job_id(), attempt = job.attempt(), error = %e, "write back refused: no longer the holder");
                Ok(())
            }
            Err(e) => {
                tracing::warn!(job_id = job.job_id(), attempt = job.attempt(), error = %e, "write back failed after retries");
                Err(e.into())
            }
        }
    }
}

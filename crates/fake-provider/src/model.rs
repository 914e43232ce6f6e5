//! Wire types of the fake provider's HTTP API, shared by the server and
//! [`ProviderClient`](super::client::ProviderClient).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The body of `POST /v1/refunds`. Two requests with the same
/// `Idempotency-Key` are "the same request" only if all four fields are equal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefundParams {
    /// The payment to refund. Ids starting with `fail_` settle `failed`.
    pub payment_id: String,
    /// Amount in minor units (cents), > 0.
    pub amount: i64,
    /// ISO currency code, compared as given (no case folding).
    pub currency: String,
    /// The caller's own reference (jobfence sends its `operation_key`):
    /// what a reconciler searches by with `GET /v1/refunds?merchant_reference=`.
    pub merchant_reference: String,
}

/// Where a refund is in its life. `pending` is not a success: the seed's
/// rule is that a job whose refund is only `pending` must not be completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefundStatus {
    /// Accepted, not settled yet; becomes `succeeded` or `failed`.
    Pending,
    /// Money moved.
    Succeeded,
    /// No money moved.
    Failed,
}

/// A refund as the provider reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refund {
    /// Provider id, `re_…`.
    pub id: String,
    /// Payment refunded.
    pub payment_id: String,
    /// Amount in minor units.
    pub amount: i64,
    /// Currency as sent.
    pub currency: String,
    /// The caller's reference as sent.
    pub merchant_reference: String,
    /// Status at the time of the answer.
    pub status: RefundStatus,
    /// Creation time, Unix seconds (on the provider's clock, which tests
    /// may have advanced).
    pub created: u64,
}

/// `GET /v1/refunds?…` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundList {
    /// Matching refunds, newest first.
    pub data: Vec<Refund>,
}

/// Money the provider actually moved, for one payment or one merchant
/// reference.
///
/// A refund counts in `refunds` and `refunded_amount` as soon as it is made,
/// i.e. while `pending` too (the money is leaving and will, unless it fails);
/// a `failed` refund moves no money and only counts in `failed`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerEntry {
    /// Refunds made (succeeded or still pending).
    pub refunds: u64,
    /// Sum of their amounts, minor units.
    pub refunded_amount: i64,
    /// Of `refunds`, how many are still pending.
    pub pending: u64,
    /// Refunds that failed (moved nothing).
    pub failed: u64,
}

/// `GET /_admin/ledger`: the ground truth the demo's invariant check reads
/// ("refunds made per operation_key: exactly 1 for every succeeded job, at
/// most 1 for every other"). Never subject to faults or lag.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    /// Per `payment_id`.
    pub payments: BTreeMap<String, LedgerEntry>,
    /// Per `merchant_reference`.
    pub merchant_references: BTreeMap<String, LedgerEntry>,
}

impl Ledger {
    /// The entry for a merchant reference (all zero if it never refunded).
    pub fn by_merchant_reference(&self, reference: &str) -> LedgerEntry {
        self.merchant_references
            .get(reference)
            .copied()
            .unwrap_or_default()
    }

    /// The entry for a payment (all zero if it never refunded).
    pub fn by_payment(&self, payment_id: &str) -> LedgerEntry {
        self.payments.get(payment_id).copied().unwrap_or_default()
    }
}

/// The error body of every 4xx/5xx answer, Stripe style:
/// `{"error":{"type":…,"message":…}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// See [`ErrorBody`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// `invalid_request_error`, `idempotency_error` or `api_error`.
    #[serde(rename = "type")]
    pub error_type: String,
    /// Machine-readable detail, e.g. `resource_missing` on a 404.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// Human-readable message.
    pub message: String,
}

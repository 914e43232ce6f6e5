//! The provider's books: refunds, idempotency keys and the ledger, all in
//! memory behind one lock. No `.await` happens while it is held, so every
//! create is atomic with respect to every other request.

use super::clock::Clock;
use super::model::{Ledger, LedgerEntry, Refund, RefundParams, RefundStatus};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Payments whose id starts with this settle `failed`.
pub const FAILING_PAYMENT_PREFIX: &str = "fail_";

/// How refunds settle and how long keys are kept.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settlement {
    /// How long an idempotency key is remembered, from its first use.
    pub idempotency_retention: Duration,
    /// Share (0..=1) of new refunds that stay `pending` for `pending_for`.
    pub pending_ratio: f64,
    /// How long a pending refund stays pending.
    pub pending_for: Duration,
}

/// What a create did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    /// A new refund: money moves (or, for a `fail_` payment, fails to).
    New(Refund),
    /// The key was seen with the same parameters inside the retention
    /// window: the original refund, nothing moved.
    Replayed(Refund),
}

/// The key was first used with other parameters (Stripe's
/// `idempotency_error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyReused;

#[derive(Debug)]
struct StoredRefund {
    id: String,
    params: RefundParams,
    created_at: Instant,
    /// Equal to `created_at` unless the refund was drawn to stay pending.
    settles_at: Instant,
    outcome: RefundStatus,
}

impl StoredRefund {
    fn status(&self, now: Instant) -> RefundStatus {
        if now < self.settles_at {
            RefundStatus::Pending
        } else {
            self.outcome
        }
    }

    fn view(&self, now: Instant, clock: &Clock) -> Refund {
        Refund {
            id: self.id.clone(),
            payment_id: self.params.payment_id.clone(),
            amount: self.params.amount,
            currency: self.params.currency.clone(),
            merchant_reference: self.params.merchant_reference.clone(),
            status: self.status(now),
            created: clock.unix_secs(self.created_at),
        }
    }
}

#[derive(Debug)]
struct KeyRecord {
    params: RefundParams,
    refund: usize,
    first_used: Instant,
}

#[derive(Debug)]
struct Books {
    refunds: Vec<StoredRefund>,
    by_id: HashMap<String, usize>,
    keys: HashMap<String, KeyRecord>,
    rng: fastrand::Rng,
}

/// How often (in creates) expired keys are swept; between sweeps an expired
/// key is still ignored when looked up.
const SWEEP_EVERY: usize = 256;

/// The refunds and idempotency keys of one provider.
#[derive(Debug)]
pub struct RefundBook {
    books: Mutex<Books>,
    settlement: Settlement,
    clock: Clock,
}

impl RefundBook {
    /// An empty book. `seed` makes refund ids and the pending draw
    /// reproducible.
    pub fn new(settlement: Settlement, clock: Clock, seed: Option<u64>) -> Self {
        // A different stream from the fault RNG, so changing fault
        // probabilities does not change which refunds stay pending.
        let rng = seed.map_or_else(fastrand::Rng::new, |s| {
            fastrand::Rng::with_seed(s ^ 0x5eed_0f5e_771e)
        });
        RefundBook {
            books: Mutex::new(Books {
                refunds: Vec::new(),
                by_id: HashMap::new(),
                keys: HashMap::new(),
                rng,
            }),
            settlement,
            clock,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Books> {
        self.books.lock().expect("refund book lock poisoned")
    }

    fn key_alive(&self, record: &KeyRecord, now: Instant) -> bool {
        now.saturating_duration_since(record.first_used) < self.settlement.idempotency_retention
    }

    /// Makes a refund, unless `key` was used inside the retention window:
    /// then the original refund if the parameters match, [`KeyReused`] if
    /// they do not. A key older than the retention window is forgotten and
    /// the request makes a new refund (the double refund the coordinator's
    /// resend window exists to prevent).
    pub fn create(&self, key: &str, params: RefundParams) -> Result<Created, KeyReused> {
        let now = self.clock.now();
        let mut books = self.lock();
        if let Some(record) = books.keys.get(key) {
            if self.key_alive(record, now) {
                if record.params != params {
                    return Err(KeyReused);
                }
                return Ok(Created::Replayed(
                    books.refunds[record.refund].view(now, &self.clock),
                ));
            }
        }
        let index = books.refunds.len();
        let id = format!("re_{:06}{:010x}", index + 1, books.rng.u64(..) >> 24);
        let pending = books.rng.f64() < self.settlement.pending_ratio;
        let outcome = if params.payment_id.starts_with(FAILING_PAYMENT_PREFIX) {
            RefundStatus::Failed
        } else {
            RefundStatus::Succeeded
        };
        let refund = StoredRefund {
            id: id.clone(),
            params: params.clone(),
            created_at: now,
            settles_at: if pending {
                now + self.settlement.pending_for
            } else {
                now
            },
            outcome,
        };
        let view = refund.view(now, &self.clock);
        books.refunds.push(refund);
        books.by_id.insert(id, index);
        books.keys.insert(
            key.to_owned(),
            KeyRecord {
                params,
                refund: index,
                first_used: now,
            },
        );
        if index % SWEEP_EVERY == SWEEP_EVERY - 1 {
            let retention = self.settlement.idempotency_retention;
            books
                .keys
                .retain(|_, r| now.saturating_duration_since(r.first_used) < retention);
        }
        Ok(Created::New(view))
    }

    /// A refund by id. With `lag`, a refund younger than it is not found.
    pub fn get(&self, id: &str, lag: Option<Duration>) -> Option<Refund> {
        let now = self.clock.now();
        let books = self.lock();
        let refund = &books.refunds[*books.by_id.get(id)?];
        visible(refund, now, lag).then(|| refund.view(now, &self.clock))
    }

    /// Refunds matching both filters (a `None` filter matches all), newest
    /// first. With `lag`, refunds younger than it are left out.
    pub fn list(
        &self,
        payment_id: Option<&str>,
        merchant_reference: Option<&str>,
        lag: Option<Duration>,
    ) -> Vec<Refund> {
        let now = self.clock.now();
        let books = self.lock();
        books
            .refunds
            .iter()
            .rev()
            .filter(|r| payment_id.is_none_or(|p| r.params.payment_id == p))
            .filter(|r| merchant_reference.is_none_or(|m| r.params.merchant_reference == m))
            .filter(|r| visible(r, now, lag))
            .map(|r| r.view(now, &self.clock))
            .collect()
    }

    /// Every refund created in `[from, to)` (Unix seconds, provider clock;
    /// `None`: unbounded), oldest first, with its status now: what the
    /// provider's settlement report lists.
    pub fn report(&self, from: Option<u64>, to: Option<u64>) -> Vec<Refund> {
        let now = self.clock.now();
        let books = self.lock();
        books
            .refunds
            .iter()
            .map(|r| r.view(now, &self.clock))
            .filter(|r| from.is_none_or(|f| r.created >= f) && to.is_none_or(|t| r.created < t))
            .collect()
    }

    /// A refund made outside the idempotent API: by hand in the provider's
    /// dashboard, or a resend after its idempotency key expired. It moves
    /// money like any other and settles at once.
    pub fn make_outside(&self, params: RefundParams) -> Refund {
        let now = self.clock.now();
        let mut books = self.lock();
        let index = books.refunds.len();
        let id = format!("re_{:06}{:010x}", index + 1, books.rng.u64(..) >> 24);
        let refund = StoredRefund {
            id: id.clone(),
            params,
            created_at: now,
            settles_at: now,
            outcome: RefundStatus::Succeeded,
        };
        let view = refund.view(now, &self.clock);
        books.refunds.push(refund);
        books.by_id.insert(id, index);
        view
    }

    /// The parameters of the newest refund of `merchant_reference`, if any.
    pub fn params_of(&self, merchant_reference: &str) -> Option<RefundParams> {
        let books = self.lock();
        books
            .refunds
            .iter()
            .rev()
            .find(|r| r.params.merchant_reference == merchant_reference)
            .map(|r| r.params.clone())
    }

    /// Money moved so far, per payment and per merchant reference.
    pub fn ledger(&self) -> Ledger {
        let now = self.clock.now();
        let books = self.lock();
        let mut ledger = Ledger::default();
        for r in &books.refunds {
            let status = r.status(now);
            for entry in [
                ledger
                    .payments
                    .entry(r.params.payment_id.clone())
                    .or_default(),
                ledger
                    .merchant_references
                    .entry(r.params.merchant_reference.clone())
                    .or_default(),
            ] {
                add(entry, status, r.params.amount);
            }
        }
        ledger
    }
}

fn visible(refund: &StoredRefund, now: Instant, lag: Option<Duration>) -> bool {
    lag.is_none_or(|lag| now.saturating_duration_since(refund.created_at) >= lag)
}

fn add(entry: &mut LedgerEntry, status: RefundStatus, amount: i64) {
    match status {
        RefundStatus::Failed => entry.failed += 1,
        RefundStatus::Pending | RefundStatus::Succeeded => {
            entry.refunds += 1;
            entry.refunded_amount += amount;
            if status == RefundStatus::Pending {
                entry.pending += 1;
            }
        }
    }
}

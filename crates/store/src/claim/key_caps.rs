//! Caps per fairness key in a claim (docs/design.md rule 18): what the
//! candidates' keys spent of their share and have in flight, read under
//! the provider's row lock (so claims of one provider, on every
//! coordinator, see each other's), and the statement that spends the
//! shares with the COMMIT. A claim of a provider with caps scans more
//! rows than it wants ([`scan_limit`]), so that a capped key's jobs
//! leave room for the next keys' instead of an empty answer.

use super::super::budget::LockedProvider;
use super::super::literal::{self, Literal};
use super::super::reads::LockedJob;
use super::super::{batch, rows};
use jobfence_domain::fairness::{KeyAllowance, KeyState};
use jobfence_domain::{CoordinatorError, DbTime, Job, JobState};
use sqlx::MySqlConnection;
use std::collections::{BTreeSet, HashMap};

/// How many rows a claim that wants `wanted` jobs scans when its
/// provider has caps per key: four times as many, at most
/// [`super::MAX_CLAIM_TRANSACTION_JOBS`] (and never fewer than wanted).
pub(crate) fn scan_limit(wanted: u32, key_capped: bool) -> u32 {
    match key_capped {
        true => wanted
            .saturating_mul(4)
            .min(super::MAX_CLAIM_TRANSACTION_JOBS)
            .max(wanted),
        false => wanted,
    }
}

fn key_of(c: &LockedJob) -> &str {
    c.job.fairness_key.as_deref().unwrap_or("")
}

/// The key allowance of a claim of `p`'s queue over `candidates`: the
/// state of each of their keys, one round trip. The share applies only
/// when the candidates hold more than one key (others are due).
pub(crate) async fn allowance(
    conn: &mut MySqlConnection,
    p: &LockedProvider,
    candidates: &[LockedJob],
    finishing: &HashMap<String, u64>,
) -> Result<KeyAllowance, CoordinatorError> {
    let keys: BTreeSet<&str> = candidates.iter().map(key_of).collect();
    let contested = keys.len() > 1;
    let caps = p.budget.per_key;
    let mut state: HashMap<String, KeyState> = keys
        .iter()
        .map(|k| {
            let s = KeyState {
                tat: None,
                in_flight: 0,
            };
            (k.to_string(), s)
        })
        .collect();
    if !keys.is_empty() {
        let provider = literal::provider(&p.name)?;
        let mut list = String::new();
        batch::json(&keys.iter().collect::<Vec<_>>())?.write_sql(&mut list);
        let mut text = vec![include_str!("../queries/fairness/key_tats.sql")
            .replace("{provider}", &provider)
            .replace("{keys}", &list)];
        if caps.max_in_flight.is_some() {
            text.push(
                include_str!("../queries/fairness/key_in_flight.sql")
                    .replace("{provider}", &provider)
                    .replace("{keys}", &list),
            );
        }
        let sets = batch::result_sets(conn, &text.join(";\n")).await?;
        for row in sets.first().into_iter().flatten() {
            if let Some(s) = state.get_mut(&rows::text(row, "fairness_key")?) {
                s.tat = Some(rows::time(row, "tat")?);
            }
        }
        for row in sets.get(1).into_iter().flatten() {
            let key = rows::text(row, "fairness_key")?;
            if let Some(s) = state.get_mut(&key) {
                let counted = rows::get::<i64>(row, "in_flight")?.max(0) as u64;
                let leaving = finishing.get(&key).copied().unwrap_or(0);
                s.in_flight = counted.saturating_sub(leaving);
            }
        }
    }
    Ok(KeyAllowance::new(caps, &p.budget, p.now, contested, state))
}

/// The jobs of each fairness key among `finishing` (a handoff's writes,
/// as locked before the claim: running with a live lease, so counted in
/// flight): they leave `running` in the same transaction, as a Complete
/// and then a Claim would (docs/design.md rule 16).
pub(crate) fn finishing(finishing: &[&Job]) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    for j in finishing {
        if j.state == JobState::Running {
            *out.entry(j.fairness_key.clone().unwrap_or_default())
                .or_default() += 1;
        }
    }
    out
}

/// The statement that records the keys' shares spent (`spent`: each key
/// and its new arrival time), sent with the COMMIT; none when nothing was
/// spent under a share.
pub(crate) fn spend(
    p: &LockedProvider,
    spent: &[(String, DbTime)],
) -> Result<Option<String>, CoordinatorError> {
    if spent.is_empty() {
        return Ok(None);
    }
    let provider = literal::provider(&p.name)?;
    let values: Vec<String> = spent
        .iter()
        .map(|(key, tat)| {
            let mut k = String::new();
            key.as_str().write_sql(&mut k);
            format!("({provider}, {k}, {})", literal::time(*tat))
        })
        .collect();
    Ok(Some(format!(
        "INSERT INTO fairness_key_budgets (provider, fairness_key, tat) VALUES {} \
         ON DUPLICATE KEY UPDATE tat = VALUES(tat)",
        values.join(", ")
    )))
}

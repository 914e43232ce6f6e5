//! Operator changes of providers and stored queue policies (docs/design.md
//! rules 11 and 13), each one short transaction that also records the
//! change, with the operator's name, in `policy_changes`.
//!
//! A change of a provider locks its row first, as every claim of its
//! queues does (see `budget.rs`): a claim runs entirely before or entirely
//! after it, so no claim spends under half-changed rules.

use super::budget::{budget, pause, stored_policy};
use super::reads::placeholders;
use super::{convert_sqlx_err, rows, JobStore};
use crate::run::{read, transaction, Body};
use jobfence_domain::budget::{Budget, Gcra, Pause};
use jobfence_domain::providers::{
    provider_subject, queue_subject, ChangeBy, PolicyAction, PolicyChange, ProviderRecord,
    PutProvider, PutQueuePolicy, QueuePolicyRecord, SetPause,
};
use jobfence_domain::FieldViolation;
use jobfence_domain::{CoordinatorError, DbTime, QueuePolicy};
use sqlx::mysql::MySqlRow;
use sqlx::MySqlConnection;
use std::collections::BTreeMap;

fn unknown_provider(name: &str) -> CoordinatorError {
    CoordinatorError::invalid("name", format!("no provider is named {name:?}"))
}

/// The JSON recorded for a provider's change.
fn provider_detail(b: &Budget, queues: &[String], pause: Pause) -> String {
    serde_json::json!({
        "rate_per_second": b.rate_per_second,
        "burst": b.burst,
        "max_in_flight": b.max_in_flight,
        "execute_cost": b.execute_cost,
        "reconcile_cost": b.reconcile_cost,
        "key_share": b.per_key.share,
        "max_in_flight_per_key": b.per_key.max_in_flight,
        "queues": queues,
        "pause": pause.as_str(),
    })
    .to_string()
}

fn policy_detail(p: Option<&QueuePolicy>, job_retention: Option<std::time::Duration>) -> String {
    match p {
        Some(p) => serde_json::json!({
            "resend_window_us": p.resend_window.as_micros() as u64,
            "resend_window": humantime::format_duration(p.resend_window).to_string(),
            "max_dispatches": p.max_dispatches,
            "job_retention": job_retention.map(|d| humantime::format_duration(d).to_string()),
        })
        .to_string(),
        None => "{}".into(),
    }
}

/// A provider row as read (without its queues and in-flight count).
fn provider_row(row: &MySqlRow) -> Result<ProviderRecord, CoordinatorError> {
    let budget = budget(row)?;
    let tat: DbTime = rows::get(row, "tat")?;
    let now: DbTime = rows::get(row, "now")?;
    let g = Gcra::at(&budget, tat, now);
    let units_available = g.available();
    Ok(ProviderRecord {
        name: rows::text(row, "name")?,
        budget,
        queues: Vec::new(),
        pause: pause(row)?,
        pause_reason: rows::opt_text(row, "pause_reason")?,
        throttled_until: rows::get(row, "throttled_until")?,
        throttle_reports: rows::get(row, "throttle_reports")?,
        units_available,
        next_unit_in: (units_available == 0).then(|| g.due_in(1)),
        in_flight: 0,
        updated_at: rows::get(row, "updated_at")?,
        updated_by: rows::text(row, "updated_by")?,
        now,
    })
}

fn policy_row(row: &MySqlRow) -> Result<QueuePolicyRecord, CoordinatorError> {
    Ok(QueuePolicyRecord {
        queue: rows::text(row, "queue")?,
        provider: rows::opt_text(row, "provider")?,
        policy: stored_policy(row)?,
        job_retention: rows::get::<Option<u64>>(row, "job_retention_us")?
            .map(std::time::Duration::from_micros),
        updated_at: rows::get(row, "updated_at")?,
        updated_by: rows::text(row, "updated_by")?,
    })
}

/// Records one change in the caller's transaction.
pub(crate) async fn record(
    conn: &mut MySqlConnection,
    subject: &str,
    action: PolicyAction,
    by: &ChangeBy,
    detail: &str,
) -> Result<(), CoordinatorError> {
    sqlx::query(include_str!("queries/policy_changes/insert.sql"))
        .bind(subject)
        .bind(action.as_str())
        .bind(&by.operator)
        .bind(&by.reason)
        .bind(detail)
        .execute(conn)
        .await
        .map_err(convert_sqlx_err)?;
    Ok(())
}

/// The rows of `queues` (the queues the caller's change touched) that hold
/// neither a provider nor a policy now are removed; the other queues' rows
/// are not read (see `queries/queue_policies/tidy.sql`).
pub(crate) async fn tidy(
    conn: &mut MySqlConnection,
    queues: &[String],
) -> Result<(), CoordinatorError> {
    if queues.is_empty() {
        return Ok(());
    }
    let sql = include_str!("queries/queue_policies/tidy.sql")
        .replace("{queues}", &super::reads::placeholders(queues.len()));
    let mut q = sqlx::query(&sql);
    for queue in queues {
        q = q.bind(queue);
    }
    q.execute(conn).await.map_err(convert_sqlx_err)?;
    Ok(())
}

/// The provider `name` locked (`FOR UPDATE`), if it exists.
async fn lock_provider(
    conn: &mut MySqlConnection,
    name: &str,
) -> Result<Option<ProviderRecord>, CoordinatorError> {
    let row = sqlx::query(include_str!("queries/providers/lock.sql"))
        .bind(name)
        .fetch_optional(conn)
        .await
        .map_err(convert_sqlx_err)?;
    row.as_ref().map(provider_row).transpose()
}

/// A provider's budget written: inserted (`new`; a new budget starts
/// full) or updated (what was spent is kept, but never more than the new
/// burst's worth).
async fn write_budget(
    conn: &mut MySqlConnection,
    req: &PutProvider,
    new: bool,
) -> Result<(), CoordinatorError> {
    let b = &req.budget;
    let query = if new {
        sqlx::query(include_str!("queries/providers/insert.sql"))
            .bind(&req.name)
            .bind(b.rate_per_second)
            .bind(b.burst)
            .bind(b.max_in_flight)
            .bind(b.execute_cost)
            .bind(b.reconcile_cost)
            .bind(b.per_key.share)
            .bind(b.per_key.max_in_flight)
            .bind(&req.by.operator)
    } else {
        sqlx::query(include_str!("queries/providers/update.sql"))
            .bind(b.rate_per_second)
            .bind(b.burst)
            .bind(b.max_in_flight)
            .bind(b.execute_cost)
            .bind(b.reconcile_cost)
            .bind(b.per_key.share)
            .bind(b.per_key.max_in_flight)
            .bind(b.tolerance_us().ceil() as i64)
            .bind(&req.by.operator)
            .bind(&req.name)
    };
    query.execute(conn).await.map_err(convert_sqlx_err)?;
    Ok(())
}

/// Gives a provider the queues of its list and releases the ones that left
/// it; returns the queues of the list that dispatch to another provider,
/// `(queue, other provider)`, read back under the row locks the writes
/// took, so two operators giving one queue to two providers at once cannot
/// both succeed (the caller then rolls back).
async fn assign_queues(
    conn: &mut MySqlConnection,
    req: &PutProvider,
) -> Result<Vec<(String, String)>, CoordinatorError> {
    let release = if req.queues.is_empty() {
        include_str!("queries/providers/release_queues.sql").to_owned()
    } else {
        include_str!("queries/providers/release_other_queues.sql")
            .replace("{queues}", &placeholders(req.queues.len()))
    };
    let mut q = sqlx::query(&release).bind(&req.by.operator).bind(&req.name);
    for queue in &req.queues {
        q = q.bind(queue);
    }
    q.execute(&mut *conn).await.map_err(convert_sqlx_err)?;
    // In the order of their names, as a claim of another provider locks
    // its queues' rows (by its index, provider then queue): a queue of the
    // list that is another provider's is locked here without that
    // provider's row, and two such queues taken in the other order would
    // close a cycle with that provider's claim.
    let mut sorted: Vec<&String> = req.queues.iter().collect();
    sorted.sort();
    for queue in sorted {
        sqlx::query(include_str!("queries/providers/assign_queue.sql"))
            .bind(queue)
            .bind(&req.name)
            .bind(&req.by.operator)
            .execute(&mut *conn)
            .await
            .map_err(convert_sqlx_err)?;
    }
    if req.queues.is_empty() {
        return Ok(Vec::new());
    }
    let sql = include_str!("queries/queue_policies/lock_queues.sql")
        .replace("{queues}", &placeholders(req.queues.len()));
    let mut q = sqlx::query(&sql);
    for queue in &req.queues {
        q = q.bind(queue);
    }
    let mut taken = Vec::new();
    for row in q.fetch_all(&mut *conn).await.map_err(convert_sqlx_err)? {
        if let Some(other) = rows::opt_text(&row, "provider")? {
            if other != req.name {
                taken.push((rows::text(&row, "queue")?, other));
            }
        }
    }
    Ok(taken)
}

/// The refusal of a PutProvider naming queues that dispatch to another
/// provider: one violation per such queue (`queues[i]`).
fn queues_taken(req: &PutProvider, taken: &[(String, String)]) -> CoordinatorError {
    CoordinatorError::InvalidArgument(
        req.queues
            .iter()
            .enumerate()
            .filter_map(|(i, q)| {
                taken.iter().find(|(t, _)| t == q).map(|(_, other)| {
                    FieldViolation::new(
                        format!("queues[{i}]"),
                        format!(
                            "queue {q:?} already dispatches to provider {other:?}: a queue has one provider (take it out of {other:?} first)"
                        ),
                    )
                })
            })
            .collect(),
    )
}

impl JobStore {
    /// Every provider of this database, by name, with its queues, what is
    /// left of its budget now and its jobs in flight.
    pub async fn list_providers(&self) -> Result<Vec<ProviderRecord>, CoordinatorError> {
        read!(self, |conn| self.list_providers_in(conn))
    }

    async fn list_providers_in(&self, conn: &mut MySqlConnection) -> Body<Vec<ProviderRecord>> {
        let found = sqlx::query(include_str!("queries/providers/list.sql"))
            .fetch_all(&mut *conn)
            .await?;
        let mut out: Vec<ProviderRecord> =
            found.iter().map(provider_row).collect::<Result<_, _>>()?;
        if out.is_empty() {
            return Ok(out);
        }
        let queues = sqlx::query(include_str!("queries/providers/queues.sql"))
            .fetch_all(&mut *conn)
            .await?;
        let mut by_provider: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for row in &queues {
            by_provider
                .entry(rows::text(row, "provider")?)
                .or_default()
                .push(rows::text(row, "queue")?);
        }
        let in_flight = sqlx::query(include_str!("queries/budget/in_flight.sql"))
            .fetch_all(&mut *conn)
            .await?;
        let mut counts: BTreeMap<String, u64> = BTreeMap::new();
        for row in &in_flight {
            counts.insert(
                rows::text(row, "provider")?,
                rows::get::<i64>(row, "in_flight")?.max(0) as u64,
            );
        }
        for p in &mut out {
            p.queues = by_provider.remove(&p.name).unwrap_or_default();
            p.in_flight = counts.get(&p.name).copied().unwrap_or(0);
        }
        Ok(out)
    }

    /// One provider of this database, if it is here.
    pub async fn get_provider(
        &self,
        name: &str,
    ) -> Result<Option<ProviderRecord>, CoordinatorError> {
        Ok(self
            .list_providers()
            .await?
            .into_iter()
            .find(|p| p.name == name))
    }

    /// Creates or replaces a provider and the list of its queues; returns
    /// whether it was created. A queue that already dispatches to another
    /// provider is refused (`InvalidArgument`, field `queues[i]`), and
    /// nothing is written. A changed budget keeps what was spent, but never
    /// more than the new burst's worth.
    pub async fn put_provider(&self, req: &PutProvider) -> Result<bool, CoordinatorError> {
        transaction!(self, |tx| self.put_provider_in(tx, req))
    }

    async fn put_provider_in(&self, tx: &mut MySqlConnection, req: &PutProvider) -> Body<bool> {
        let before = lock_provider(tx, &req.name).await?;
        // Its queues, under its lock: those it releases are among them.
        let had = self.queues_of(tx, &req.name).await?;
        write_budget(tx, req, before.is_none()).await?;
        let taken = assign_queues(tx, req).await?;
        if !taken.is_empty() {
            return Err(queues_taken(req, &taken).into());
        }
        tidy(tx, &had).await?;
        let mut queues = req.queues.clone();
        queues.sort();
        let pause = before.as_ref().map_or(Pause::None, |p| p.pause);
        record(
            tx,
            &provider_subject(&req.name),
            PolicyAction::PutProvider,
            &req.by,
            &provider_detail(&req.budget, &queues, pause),
        )
        .await?;
        Ok(before.is_none())
    }

    /// Deletes a provider (its queues become unlimited); returns it as it
    /// was. `InvalidArgument` (field `name`) when there is none.
    pub async fn delete_provider(
        &self,
        name: &str,
        by: &ChangeBy,
    ) -> Result<ProviderRecord, CoordinatorError> {
        // As it was, read before the transaction (its own connection).
        let before = self
            .get_provider(name)
            .await?
            .ok_or_else(|| unknown_provider(name))?;
        transaction!(self, |tx| self.delete_provider_in(
            tx,
            name,
            by,
            before.clone()
        ))
    }

    async fn delete_provider_in(
        &self,
        tx: &mut MySqlConnection,
        name: &str,
        by: &ChangeBy,
        before: ProviderRecord,
    ) -> Body<ProviderRecord> {
        if lock_provider(tx, name).await?.is_none() {
            return Err(unknown_provider(name).into());
        }
        let had = self.queues_of(tx, name).await?;
        sqlx::query(include_str!("queries/providers/release_queues.sql"))
            .bind(&by.operator)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        tidy(tx, &had).await?;
        sqlx::query(include_str!("queries/providers/delete.sql"))
            .bind(name)
            .execute(&mut *tx)
            .await?;
        record(
            tx,
            &provider_subject(name),
            PolicyAction::DeleteProvider,
            by,
            &provider_detail(&before.budget, &before.queues, before.pause),
        )
        .await?;
        Ok(before)
    }

    /// Pauses a provider (`Pause::All` or `Pause::Sends`), or resumes it
    /// (`Pause::None`, which also ends a throttle a worker reported).
    /// `InvalidArgument` (field `name`) for an unknown provider.
    pub async fn set_pause(&self, req: &SetPause) -> Result<(), CoordinatorError> {
        transaction!(self, |tx| self.set_pause_in(tx, req))
    }

    async fn set_pause_in(&self, tx: &mut MySqlConnection, req: &SetPause) -> Body<()> {
        let Some(before) = lock_provider(tx, &req.name).await? else {
            return Err(unknown_provider(&req.name).into());
        };
        let (action, reason) = match req.pause {
            Pause::None => (PolicyAction::ResumeProvider, None),
            _ => (PolicyAction::PauseProvider, Some(req.by.reason.as_str())),
        };
        // A resume also ends a throttle a worker reported.
        let sql = if req.pause == Pause::None {
            include_str!("queries/providers/resume.sql")
        } else {
            include_str!("queries/providers/pause.sql")
        };
        sqlx::query(sql)
            .bind(req.pause.as_str())
            .bind(reason.map(|r| truncate(r, 255)))
            .bind(&req.by.operator)
            .bind(&req.name)
            .execute(&mut *tx)
            .await?;
        let queues = self.queues_of(tx, &req.name).await?;
        record(
            tx,
            &provider_subject(&req.name),
            action,
            &req.by,
            &provider_detail(&before.budget, &queues, req.pause),
        )
        .await?;
        Ok(())
    }

    async fn queues_of(
        &self,
        conn: &mut MySqlConnection,
        provider: &str,
    ) -> Result<Vec<String>, CoordinatorError> {
        let found = sqlx::query(include_str!("queries/queue_policies/of_provider.sql"))
            .bind(provider)
            .fetch_all(&mut *conn)
            .await
            .map_err(convert_sqlx_err)?;
        found.iter().map(|r| rows::text(r, "queue")).collect()
    }

    /// Stores a queue's resend policy (it wins over the coordinators'
    /// flags from the next claim or Fail on).
    pub async fn put_queue_policy(&self, req: &PutQueuePolicy) -> Result<(), CoordinatorError> {
        transaction!(self, |tx| self.put_queue_policy_in(tx, req))
    }

    async fn put_queue_policy_in(
        &self,
        tx: &mut MySqlConnection,
        req: &PutQueuePolicy,
    ) -> Body<()> {
        sqlx::query(include_str!("queries/queue_policies/put.sql"))
            .bind(&req.queue)
            .bind(req.policy.resend_window.as_micros() as u64)
            .bind(req.policy.max_dispatches)
            .bind(req.job_retention.map(|d| d.as_micros() as u64))
            .bind(&req.by.operator)
            .execute(&mut *tx)
            .await?;
        record(
            tx,
            &queue_subject(&req.queue),
            PolicyAction::PutQueuePolicy,
            &req.by,
            &policy_detail(Some(&req.policy), req.job_retention),
        )
        .await?;
        Ok(())
    }

    /// Removes a queue's stored resend policy; returns the row as it was.
    /// `InvalidArgument` (field `queue`) when the queue has none.
    pub async fn delete_queue_policy(
        &self,
        queue: &str,
        by: &ChangeBy,
    ) -> Result<QueuePolicyRecord, CoordinatorError> {
        transaction!(self, |tx| self.delete_queue_policy_in(tx, queue, by))
    }

    async fn delete_queue_policy_in(
        &self,
        tx: &mut MySqlConnection,
        queue: &str,
        by: &ChangeBy,
    ) -> Body<QueuePolicyRecord> {
        let row = sqlx::query(include_str!("queries/queue_policies/lock.sql"))
            .bind(queue)
            .fetch_optional(&mut *tx)
            .await?;
        let before = row.as_ref().map(policy_row).transpose()?;
        let Some(before) = before.filter(|b| b.policy.is_some()) else {
            return Err(CoordinatorError::invalid(
                "queue",
                format!("queue {queue:?} has no stored policy"),
            )
            .into());
        };
        sqlx::query(include_str!("queries/queue_policies/clear.sql"))
            .bind(&by.operator)
            .bind(queue)
            .execute(&mut *tx)
            .await?;
        tidy(tx, &[queue.to_owned()]).await?;
        record(
            tx,
            &queue_subject(queue),
            PolicyAction::DeleteQueuePolicy,
            by,
            &policy_detail(before.policy.as_ref(), before.job_retention),
        )
        .await?;
        Ok(before)
    }

    /// Every queue row of this database (a stored policy or a provider),
    /// by queue.
    pub async fn list_queue_policies(&self) -> Result<Vec<QueuePolicyRecord>, CoordinatorError> {
        let found = self
            .fetch_rows(sqlx::query(include_str!("queries/queue_policies/list.sql")))
            .await;
        found?.iter().map(policy_row).collect()
    }

    /// Recorded changes, newest first: of `subject` only when given, with
    /// ids below `before` when given, at most `limit`.
    pub async fn list_policy_changes(
        &self,
        subject: Option<&str>,
        before: Option<u64>,
        limit: u32,
    ) -> Result<Vec<PolicyChange>, CoordinatorError> {
        let found = self
            .fetch_rows(
                sqlx::query(include_str!("queries/policy_changes/list.sql"))
                    .bind(subject)
                    .bind(subject)
                    .bind(before)
                    .bind(before)
                    .bind(limit),
            )
            .await;
        found?
            .iter()
            .map(|r| {
                Ok(PolicyChange {
                    id: rows::get(r, "id")?,
                    changed_at: rows::get(r, "changed_at")?,
                    operator: rows::text(r, "operator")?,
                    subject: rows::text(r, "subject")?,
                    action: rows::text(r, "action")?,
                    reason: rows::text(r, "reason")?,
                    detail: rows::text(r, "detail")?,
                })
            })
            .collect()
    }
}

/// `s` cut to at most `max` bytes, on a character boundary.
pub(crate) fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

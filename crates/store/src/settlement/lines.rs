//! A report's lines, stored by the provider's id of each refund, and who
//! holds their operation keys.

use super::on_insert::{decide_on_insert, holders_on};
use super::references::keys_by_reference;
use super::{json_list, string_list};
use super::{FastMap, FastSet};
use crate::rows::{get, opt_text, text};
use crate::run::{transaction, Body};
use crate::{convert_sqlx_err, literal, JobStore};
use jobfence_domain::settlement::held::Held;
use jobfence_domain::settlement::records::{LineCounts, QueueAmounts};
use jobfence_domain::settlement::{LineStatus, Outcome, SettlementLine};
use jobfence_domain::{CoordinatorError, DbTime};
use sqlx::mysql::MySqlRow;
use sqlx::Executor as _;
use sqlx::MySqlConnection;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

/// The stored lines of one operation key (or one keyless line), as read
/// for a decision, and when they were read.
#[derive(Debug, Clone)]
pub struct KeyLines {
    /// The operation key; `None` for a line that names none and matched no
    /// job by its provider reference.
    pub key: Option<String>,
    /// `(line id, line)`.
    pub lines: Vec<(u64, SettlementLine)>,
    pub read_at: DbTime,
}

fn line_row(row: &MySqlRow) -> Result<(u64, SettlementLine), CoordinatorError> {
    let status = text(row, "status")?;
    Ok((
        get(row, "id")?,
        SettlementLine {
            provider_reference: text(row, "provider_reference")?,
            operation_key: opt_text(row, "operation_key")?,
            amount_minor: get(row, "amount_minor")?,
            currency: text(row, "currency")?,
            status: status
                .parse::<LineStatus>()
                .map_err(|e| CoordinatorError::Internal(format!("{e}")))?,
            created_at: get(row, "refund_created_at")?,
        },
    ))
}

impl JobStore {
    /// Writes a batch of a report's lines in one short transaction: a line
    /// not held is inserted, a line held with something else (a new
    /// status) rewritten, a line held exactly so left alone; each written
    /// line is left undecided, for [`undecided_settlement_lines`]
    /// (Self::undecided_settlement_lines) to match, except a new line
    /// that the domain's `on_insert` decides in the same transaction
    /// (`jobfence_domain::settlement::on_insert`, from who holds its key
    /// among `queues`): it is inserted decided, and its outcome is
    /// returned. A line that names no operation key gets the key of the
    /// job (or key record) of the provider's `queues` whose recorded
    /// provider reference is the line's. Run again on a conflict; two
    /// imports of one file at once write each line once.
    pub async fn put_settlement_lines(
        &self,
        provider: &str,
        queues: &[QueueAmounts],
        lines: &[SettlementLine],
    ) -> Result<(LineCounts, Vec<Outcome>), CoordinatorError> {
        if lines.is_empty() {
            return Ok(Default::default());
        }
        // The last of two lines with one reference in a batch wins, as a
        // later report's would. A line is copied only if its key is filled
        // in (`fill_keys`: a read of its own, before the transaction).
        let mut batch: BTreeMap<&str, Cow<'_, SettlementLine>> = BTreeMap::new();
        for l in lines {
            batch.insert(l.provider_reference.as_str(), Cow::Borrowed(l));
        }
        self.fill_keys(queues, &mut batch).await?;
        transaction!(self, |tx| self.put_lines_in(tx, provider, queues, &batch))
    }

    async fn put_lines_in(
        &self,
        tx: &mut MySqlConnection,
        provider: &str,
        queues: &[QueueAmounts],
        batch: &BTreeMap<&str, Cow<'_, SettlementLine>>,
    ) -> Body<(LineCounts, Vec<Outcome>)> {
        // The provider's name is bound, never written into the text: it
        // needs no check of its characters here (it comes from the stored
        // settings, which checked it).
        let held: FastMap<String, (u64, SettlementLine)> =
            sqlx::query(include_str!("../queries/settlement/lines_existing.sql"))
                .bind(json_list(&batch.keys().copied().collect::<Vec<_>>())?)
                .bind(provider)
                .fetch_all(&mut *tx)
                .await?
                .iter()
                .map(|r| line_row(r).map(|(id, l)| (l.provider_reference.clone(), (id, l))))
                .collect::<Result<_, _>>()?;
        self.pause_in(crate::pause::PausePoint::SettlementLinesLocked, tx)
            .await;
        let written: Vec<&SettlementLine> = batch
            .iter()
            .filter(|(r, l)| held.get(**r).is_none_or(|(_, old)| !same(old, l)))
            .map(|(_, l)| &**l)
            .collect();
        let new: FastSet<&str> = batch
            .keys()
            .copied()
            .filter(|r| !held.contains_key(*r))
            .collect();
        let decided = decide_on_insert(tx, provider, queues, &written, &new).await?;
        self.pause_in(crate::pause::PausePoint::SettlementBeforeInsert, tx)
            .await;
        let mut counts = LineCounts::default();
        let mut rows = Vec::new();
        let mut outcomes = Vec::new();
        for (reference, line) in batch {
            match held.get(*reference) {
                None => {
                    counts.new += 1;
                    let outcome = decided.get(*reference).cloned();
                    rows.push(LineRow::of(line, outcome.is_some())?);
                    outcomes.extend(outcome);
                }
                Some((_, old)) if same(old, line) => counts.unchanged += 1,
                Some((id, _)) => {
                    counts.updated += 1;
                    update_line(tx, *id, line).await?;
                }
            }
        }
        if !rows.is_empty() {
            sqlx::query(include_str!("../queries/settlement/lines_insert.sql"))
                .bind(provider)
                .bind(crate::batch::json(&rows)?)
                .execute(&mut *tx)
                .await
                // Another import inserted one of these refunds after this
                // batch's read (and committed it: the insert waited for
                // it). The batch runs again, counted as a conflict, and
                // then sees that line: its own status is applied over it
                // as an update, not dropped.
                .map_err(crate::errors::conflict_if_unique)?;
        }
        Ok((counts, outcomes))
    }

    /// Gives each keyless line of `batch` the key of the job (or key
    /// record) whose provider reference it is, if one is.
    async fn fill_keys(
        &self,
        queues: &[QueueAmounts],
        batch: &mut BTreeMap<&str, Cow<'_, SettlementLine>>,
    ) -> Result<(), CoordinatorError> {
        let keyless: Vec<&str> = batch
            .iter()
            .filter(|(_, l)| l.operation_key.is_none())
            .map(|(r, _)| *r)
            .collect();
        if keyless.is_empty() || queues.is_empty() {
            return Ok(());
        }
        let mut conn = self.pool().acquire().await.map_err(convert_sqlx_err)?;
        let found = keys_by_reference(&mut conn, queues, &keyless).await?;
        for (reference, by) in found {
            if let Some(line) = batch.get_mut(reference.as_str()) {
                line.to_mut().operation_key = Some(by.operation_key);
            }
        }
        Ok(())
    }

    /// Up to `limit` undecided lines of the provider, grouped by key, each
    /// key with all its lines (decided or not) as they are now: what a
    /// decision reads.
    pub async fn undecided_settlement_lines(
        &self,
        provider: &str,
        limit: u32,
    ) -> Result<Vec<KeyLines>, CoordinatorError> {
        self.pause(crate::pause::PausePoint::SettlementBeforeDecide)
            .await;
        let pool = self.pool();
        let undecided = sqlx::query(include_str!("../queries/settlement/undecided.sql"))
            .bind(provider)
            .bind(limit)
            .fetch_all(&pool)
            .await
            .map_err(convert_sqlx_err)?;
        let mut keys = Vec::new();
        let mut keyless = Vec::new();
        for row in &undecided {
            match opt_text(row, "operation_key")? {
                Some(k) => keys.push(k),
                None => keyless.push(get::<u64>(row, "id")?),
            }
        }
        keys.sort();
        keys.dedup();
        let mut out = Vec::new();
        if !keys.is_empty() {
            let sql = include_str!("../queries/settlement/lines_of_keys.sql")
                .replace("{provider}", &literal::provider(provider)?)
                .replace("{keys}", &string_list(keys.iter().map(String::as_str)));
            let rows = (&pool)
                .fetch_all(sqlx::raw_sql(&sql))
                .await
                .map_err(convert_sqlx_err)?;
            let mut by_key: BTreeMap<String, KeyLines> = BTreeMap::new();
            for row in &rows {
                let (id, line) = line_row(row)?;
                let key = line.operation_key.clone().unwrap_or_default();
                let read_at: DbTime = get(row, "read_at")?;
                by_key
                    .entry(key.clone())
                    .or_insert_with(|| KeyLines {
                        key: Some(key),
                        lines: Vec::new(),
                        read_at,
                    })
                    .lines
                    .push((id, line));
            }
            out.extend(by_key.into_values());
        }
        if !keyless.is_empty() {
            let ids = keyless
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(",");
            let sql = include_str!("../queries/settlement/lines_of_references.sql")
                .replace("{ids}", &ids);
            for row in (&pool)
                .fetch_all(sqlx::raw_sql(&sql))
                .await
                .map_err(convert_sqlx_err)?
            {
                out.push(KeyLines {
                    key: None,
                    read_at: get(&row, "read_at")?,
                    lines: vec![line_row(&row)?],
                });
            }
        }
        Ok(out)
    }

    /// Who holds each of `keys` among the provider's `queues`: every job
    /// that does (with its payload and recorded provider reference; more
    /// than one when two of the queues used the key), oldest first, else
    /// every key record of a pruned one; absent keys are held by nobody.
    pub async fn settlement_holders(
        &self,
        queues: &[QueueAmounts],
        keys: &[&str],
    ) -> Result<HashMap<String, Vec<Held>>, CoordinatorError> {
        let mut conn = self.pool().acquire().await.map_err(convert_sqlx_err)?;
        let out = holders_on(&mut conn, queues, keys, false).await?;
        self.pause(crate::pause::PausePoint::SettlementAfterHolders)
            .await;
        Ok(out.into_iter().collect())
    }

    /// The settlement lines of the job of `queue` and `operation_key`:
    /// `(provider, line)`, oldest first.
    pub async fn settlement_lines_of(
        &self,
        queue: &str,
        operation_key: &str,
    ) -> Result<Vec<(String, SettlementLine)>, CoordinatorError> {
        let rows = self
            .fetch_rows(
                sqlx::query(include_str!("../queries/settlement/lines_of_job.sql"))
                    .bind(queue)
                    .bind(operation_key),
            )
            .await;
        rows?
            .iter()
            .map(|r| Ok((text(r, "provider")?, line_row(r)?.1)))
            .collect()
    }

    /// Marks `ids` decided, unless one changed after `read_at` (a later
    /// import rewrote it: it is matched again).
    pub async fn settlement_lines_decided(
        &self,
        ids: &[u64],
        read_at: DbTime,
    ) -> Result<(), CoordinatorError> {
        if ids.is_empty() {
            return Ok(());
        }
        let list = ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        let sql = include_str!("../queries/settlement/lines_decided.sql")
            .replace("{ids}", &list)
            .replace("{read_at}", &literal::time(read_at));
        (&self.pool())
            .execute(sqlx::raw_sql(&sql))
            .await
            .map_err(convert_sqlx_err)?;
        Ok(())
    }
}

fn same(a: &SettlementLine, b: &SettlementLine) -> bool {
    a == b
}

/// A new line as lines_insert.sql reads it from its JSON array (the
/// statement's comment names the fields).
#[derive(serde::Serialize)]
struct LineRow<'a> {
    r: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    k: Option<&'a str>,
    a: u64,
    c: &'a str,
    s: &'a str,
    #[serde(serialize_with = "crate::batch::db_time")]
    t: DbTime,
    d: u8,
}

impl<'a> LineRow<'a> {
    /// Line `l`, marked decided when `decided`.
    fn of(l: &'a SettlementLine, decided: bool) -> Result<Self, CoordinatorError> {
        Ok(LineRow {
            r: &l.provider_reference,
            k: l.operation_key.as_deref(),
            a: u64::try_from(l.amount_minor)
                .map_err(|_| CoordinatorError::Internal("a settlement amount below zero".into()))?,
            c: &l.currency,
            s: l.status.as_str(),
            t: l.created_at,
            d: u8::from(decided),
        })
    }
}

async fn update_line(
    conn: &mut sqlx::MySqlConnection,
    id: u64,
    l: &SettlementLine,
) -> Result<(), CoordinatorError> {
    sqlx::query(include_str!("../queries/settlement/line_update.sql"))
        .bind(l.operation_key.as_deref())
        .bind(l.amount_minor)
        .bind(&l.currency)
        .bind(l.status.as_str())
        .bind(l.created_at)
        .bind(id)
        .execute(conn)
        .await
        .map_err(convert_sqlx_err)?;
    Ok(())
}

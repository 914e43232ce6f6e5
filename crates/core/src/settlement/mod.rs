//! Settlement (docs/design.md rule 15): a provider's report imported
//! through the coordinator, matched by operation key against the jobs and
//! key records of the provider's queues, in short transactions.
//!
//! An import is a session ([`Import`]): [`Coordinator::start_import`]
//! finds the provider's settings, [`Import::lines`] takes each batch of a
//! report's lines as the caller streams them (read through the provider's
//! mapping; a bad line is refused with its number and nothing of it is
//! written), writes them, and decides every key they touched; and
//! [`Import::finish`] records the period, matches what an earlier import
//! cut off midway left undecided, and looks for succeeded jobs with no
//! refund. The file is never held whole: a batch at a time.
//!
//! An import paces itself by what it costs the workers
//! (`jobfence_domain::pacing`, measured by `jobfence_store::pacing`):
//! after each batch it rests as long as needed for the workers' jobs to
//! keep 85 % of their rate without it, and not at all when nothing else
//! runs. How it is paced is in its listing while it runs
//! ([`Coordinator::settlement_imports`]), in the metrics
//! (`jobfence_background_*{work="settlement_import"}`), in the log when it
//! starts or stops yielding, and in its summary.

mod admin;
mod decide;
pub mod gauges;
pub mod running;

use super::Coordinator;
use jobfence_domain::pacing::{Pace, Rest};
use jobfence_domain::settlement::mapping::{LineRefusal, RawLine};
use jobfence_domain::settlement::records::{LineCounts, SettlementSettings};
use jobfence_domain::settlement::{ExceptionKind, SettlementLine};
use jobfence_domain::validate::Violations;
use jobfence_domain::{CoordinatorError, DbTime};
use jobfence_store::pacing::Paced;
use jobfence_store::settlement::report::MissingCursor;
use jobfence_store::JobStore;
use running::Listed;
use std::time::Duration;

pub use jobfence_domain::settlement::records::Tally;
pub use running::ImportProgress;

/// The `work` label of an import's pacing metrics.
const WORK: &str = "settlement_import";

/// Most lines one streamed batch may carry.
pub const MAX_BATCH_LINES: usize = 2000;
/// Refused lines an import's summary lists one by one (all are counted).
pub const MAX_LISTED_REFUSALS: usize = 100;

/// What an import is told first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportHeader {
    pub provider: String,
    /// The period the report covers, `[start, end)` UTC.
    pub period: (DbTime, DbTime),
    /// Who imports it (the operator credential's name).
    pub operator: String,
    /// Read and check every line, write nothing (`--strict`'s first pass).
    pub check_only: bool,
    /// A report with no line at all is taken (the provider refunded
    /// nothing in the period), if its header row names every column of
    /// the provider's settings; otherwise it is refused and covers
    /// nothing. A report whose lines were all refused is never taken.
    pub allow_empty: bool,
}

/// The earliest start of a period a report may cover.
fn earliest_period() -> DbTime {
    chrono::NaiveDate::from_ymd_opt(2000, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .expect("a valid date")
}

/// How an import was paced, for its summary.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ImportPacing {
    /// What the pacing last found.
    pub pace: Pace,
    /// How long the import rested to leave the database to the workers,
    /// and to measure their rate without it.
    pub yielded: Duration,
    pub probed: Duration,
}

impl Default for ImportPacing {
    fn default() -> Self {
        ImportPacing {
            pace: Pace::Alone,
            yielded: Duration::ZERO,
            probed: Duration::ZERO,
        }
    }
}

/// What an import did, for its summary.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ImportSummary {
    pub lines_read: u64,
    pub lines_refused: u64,
    /// The first [`MAX_LISTED_REFUSALS`] refusals.
    pub refusals: Vec<LineRefusal>,
    pub lines: LineCounts,
    pub decided: Tally,
    /// The succeeded jobs found with no refund in the covered periods
    /// (exceptions raised or kept).
    pub missing: u64,
    pub pacing: ImportPacing,
}

/// An import in progress (see the module docs).
pub struct Import {
    coordinator: Coordinator,
    store: JobStore,
    settings: SettlementSettings,
    header: ImportHeader,
    summary: ImportSummary,
    /// Some line of the import was read whole.
    accepted_any: bool,
    /// The report's header row was checked against the mapping
    /// ([`Import::columns`]): a line missing a column is its own fault.
    columns_checked: bool,
    /// The mapping's column the header row lacks though it was taken (the
    /// operation key's: a report with lines matches those by reference),
    /// `(field, column)`: an empty report is then refused.
    header_lacks: Option<(&'static str, String)>,
    /// Its pacing (`None` when it only checks: it writes nothing).
    paced: Option<Paced>,
    /// Its place among the coordinator's running imports.
    listed: Listed,
}

impl Coordinator {
    /// Starts an import of `header.provider`'s report. Errors:
    /// `InvalidArgument` for an unknown provider or one without settlement
    /// settings (field `provider`), an empty or reversed period, or one
    /// not yet ended by the clock of the provider's database
    /// (`period_end`, docs/design.md rule 2: a period covered is where
    /// succeeded jobs with no refund are looked for, and its later jobs
    /// would all look missing), one starting before 2000
    /// (`period_start`), no operator name.
    pub async fn start_import(&self, header: ImportHeader) -> Result<Import, CoordinatorError> {
        let mut v = Violations::default();
        v.key("operator", &header.operator);
        if header.period.1 <= header.period.0 {
            v.add("period_end", "must be after period_start");
        }
        if header.period.0 < earliest_period() {
            v.add("period_start", "must be 2000-01-01 or later");
        }
        v.required("provider", &header.provider, "must name a provider");
        v.finish()?;
        let (store, settings) = self.settlement_home(&header.provider).await?;
        // The jobs' finished times are the database's: so is "ended".
        let now = store.clock().await?;
        if header.period.1 > now {
            return Err(CoordinatorError::invalid(
                "period_end",
                format!(
                    "{} has not come yet (now {} by the database's clock): a report covers \
                     a period that has ended",
                    header.period.1.format("%Y-%m-%d %H:%M:%S UTC"),
                    now.format("%Y-%m-%d %H:%M:%S UTC")
                ),
            ));
        }
        let listed = self.pipelines.imports.add(
            ImportProgress {
                import_id: String::new(),
                provider: header.provider.clone(),
                operator: header.operator.clone(),
                running: Duration::ZERO,
                lines_read: 0,
                pace: Pace::Alone,
                yielded: Duration::ZERO,
            },
            &self.metrics,
        );
        Ok(Import {
            coordinator: self.clone(),
            paced: (!header.check_only).then(|| store.paced()),
            store,
            settings,
            header,
            summary: ImportSummary::default(),
            accepted_any: false,
            columns_checked: false,
            header_lacks: None,
            listed,
        })
    }

    /// The database holding `provider`'s settlement settings, and them.
    pub(crate) async fn settlement_home(
        &self,
        provider: &str,
    ) -> Result<(JobStore, SettlementSettings), CoordinatorError> {
        for (_, store) in self.shards().all() {
            if let Some(settings) = store.settlement_settings(provider).await? {
                return Ok((store.clone(), settings));
            }
        }
        Err(CoordinatorError::invalid(
            "provider",
            format!(
                "provider {provider:?} has no settlement settings here \
                 (set them with `jobfence settlement configure --provider {provider} --preset …`)"
            ),
        ))
    }
}

impl Import {
    /// Names the import among the coordinator's running ones, as its
    /// importer will look for it ([`Coordinator::settlement_imports`]).
    pub fn named(&mut self, import_id: &str) {
        self.listed.update(|p| p.import_id = import_id.to_owned());
    }

    /// The provider's settings the import reads its lines with.
    pub fn settings(&self) -> &SettlementSettings {
        &self.settings
    }

    /// The columns the report's header row names (CSV), before any line:
    /// `InvalidArgument` on `columns.<field>` for a column the provider's
    /// settings name that is not among them, or that the row names twice
    /// (which of the two holds the field cannot be told); nothing written,
    /// no period recorded. The operation key's column may be absent (each
    /// line is then matched by its provider reference), unless the report
    /// turns out to have no line ([`Import::finish`]). After it, a line
    /// missing a column is refused alone.
    pub fn columns(&mut self, names: &[String]) -> Result<(), CoordinatorError> {
        if self.summary.lines_read > 0 || self.columns_checked {
            return Err(CoordinatorError::invalid(
                "columns",
                "a report's columns come once, before its first line",
            ));
        }
        let mut v = Violations::default();
        let settings_say = "the provider's settings name it (`jobfence settlement configure` \
                            changes them)";
        for (field, column) in self.settings.mapping.columns() {
            let times = names.iter().filter(|n| *n == column).count();
            if times > 1 {
                v.add(
                    &format!("columns.{field}"),
                    format!(
                        "the report's header row names column {column:?} {times} times, so \
                         which one holds the {field} cannot be told"
                    ),
                );
            } else if times == 0 && field == "operation_key" {
                self.header_lacks = Some((field, column.to_owned()));
            } else if times == 0 {
                v.add(
                    &format!("columns.{field}"),
                    format!(
                        "the report's header row has no column {column:?} (it names {}); \
                         {settings_say}",
                        names.join(", ")
                    ),
                );
            }
        }
        v.finish()?;
        self.columns_checked = true;
        Ok(())
    }

    /// One batch of the report's lines, as the caller read them. Refused
    /// lines are counted and listed; the others are written and their keys
    /// decided (unless the import only checks).
    pub async fn lines(&mut self, raw: &[RawLine]) -> Result<(), CoordinatorError> {
        if raw.len() > MAX_BATCH_LINES {
            return Err(CoordinatorError::invalid(
                "lines",
                format!("at most {MAX_BATCH_LINES} lines in one message"),
            ));
        }
        // Reading the lines is the import's work too: measured with the
        // batch, not as part of the rest before it.
        self.batch_starts().await;
        let good = self.read_lines(raw)?;
        let read = self.summary.lines_read;
        self.listed.update(|p| p.lines_read = read);
        if !self.header.check_only && !good.is_empty() {
            self.write(&good).await?;
        }
        self.batch_ended().await;
        Ok(())
    }

    /// A batch's lines read through the provider's mapping: those taken;
    /// the others counted and listed as refused.
    fn read_lines(&mut self, raw: &[RawLine]) -> Result<Vec<SettlementLine>, CoordinatorError> {
        let mut good: Vec<SettlementLine> = Vec::with_capacity(raw.len());
        let mut missing: Option<&LineRefusal> = None;
        let mut refused_here = Vec::new();
        for r in raw {
            self.summary.lines_read += 1;
            match self.settings.mapping.read(r) {
                Ok(line) => good.push(line),
                Err(refused) => refused_here.push(refused),
            }
        }
        // A mapping naming a column the report does not have refuses the
        // whole import (nothing written), not each of its lines.
        if good.is_empty() && !self.accepted_any && !self.columns_checked {
            missing = refused_here.first().filter(|first| {
                first.column_missing
                    && refused_here
                        .iter()
                        .all(|r| r.column_missing && r.field == first.field)
            });
        }
        if let Some(m) = missing {
            return Err(CoordinatorError::invalid(
                format!("columns.{}", m.field),
                format!(
                    "{} (the provider's settings name it; `jobfence settlement configure` changes them)",
                    m.why
                ),
            ));
        }
        self.accepted_any |= !good.is_empty();
        for refused in refused_here {
            self.summary.lines_refused += 1;
            if self.summary.refusals.len() < MAX_LISTED_REFUSALS {
                self.summary.refusals.push(refused);
            }
        }
        Ok(good)
    }

    /// Writes a batch's good lines and decides their keys.
    async fn write(&mut self, good: &[SettlementLine]) -> Result<(), CoordinatorError> {
        let settings = &self.settings;
        let (counts, decided) = self
            .store
            .put_settlement_lines(&settings.provider, &settings.queues, good)
            .await?;
        self.summary.lines.add(counts);
        self.summary.decided.add(&Tally::counted(&decided));
        self.coordinator
            .metrics
            .settlement_lines(&self.settings.provider, counts, 0);
        // Every line written was decided with its insert: nothing of this
        // batch is left for the decision pass (what an earlier import cut
        // off left undecided is decided by `finish`).
        if counts.updated == 0 && decided.len() as u64 == counts.new {
            return Ok(());
        }
        self.decide_undecided(good.len() as u32).await
    }

    /// Decides the provider's undecided lines, `limit` at a time, until
    /// none is left.
    async fn decide_undecided(&mut self, limit: u32) -> Result<(), CoordinatorError> {
        loop {
            let batch = self
                .store
                .undecided_settlement_lines(&self.settings.provider, limit.max(100))
                .await?;
            if batch.is_empty() {
                return Ok(());
            }
            let decided =
                decide::apply(&self.coordinator, &self.store, &self.settings, &batch).await?;
            self.coordinator
                .metrics
                .settlement_resolved(&self.settings.provider, decided.resolved.len() as u64);
            self.summary.decided.add(&decided);
        }
    }

    /// A paced step of the import (a batch of lines, a page of the final
    /// search) starts.
    async fn batch_starts(&mut self) {
        if let Some(p) = &mut self.paced {
            p.batch_starts().await;
        }
    }

    /// The step ended: the import rests as its pacing says; the metrics,
    /// the listing and, when it starts or stops yielding, the log say so.
    async fn batch_ended(&mut self) {
        let Some(p) = &mut self.paced else { return };
        let before = p.pace();
        let rest: Rest = p.batch_ended().await;
        let pace = p.pace();
        let (yielded, probed) = (p.yielded(), p.probed());
        self.coordinator.metrics.rested(WORK, &rest);
        self.listed.update(|l| {
            l.pace = pace;
            l.yielded = yielded;
        });
        self.summary.pacing = ImportPacing {
            pace,
            yielded,
            probed,
        };
        if pace.yielding() != before.yielding() {
            tracing::info!(
                provider = %self.settings.provider,
                operator = %self.header.operator,
                lines_read = self.summary.lines_read,
                yielded_seconds = yielded.as_secs_f64(),
                pace = %pace,
                "settlement import pace"
            );
        }
        if let Some(p) = &mut self.paced {
            p.rest(&rest).await;
        }
    }

    /// Refuses a report with no line taken. Refused lines are no evidence:
    /// a report whose every line was refused lists no refund that can be
    /// trusted, `allow_empty` or not. A report with no line at all covers
    /// its period only with `allow_empty` and a header row that named
    /// every column of the provider's settings: without one, nothing tells
    /// an export of a day with no refund from a failed download.
    fn taken_any(&self) -> Result<(), CoordinatorError> {
        if self.accepted_any {
            return Ok(());
        }
        let covers_nothing = "so it covers nothing (a failed download leaves an empty or broken \
                              file, and a covered period with no refund makes every succeeded \
                              job of it missing at the provider)";
        if self.summary.lines_read > 0 {
            return Err(CoordinatorError::invalid(
                "lines",
                format!(
                    "every one of the report's {} lines was refused, {covers_nothing}; \
                     allow_empty (--allow-empty) takes a report with no line, never one whose \
                     lines were all refused",
                    self.summary.lines_read
                ),
            ));
        }
        if !self.header.allow_empty {
            return Err(CoordinatorError::invalid(
                "lines",
                format!(
                    "the report has no line, {covers_nothing}; if the provider refunded nothing \
                     in the period, import it with allow_empty (--allow-empty)"
                ),
            ));
        }
        let header = self.settings.mapping.columns().map(|(_, c)| c).join(",");
        if !self.columns_checked {
            return Err(CoordinatorError::invalid(
                "lines",
                format!(
                    "the report has no line and no header row, so nothing shows it is the \
                     provider's export rather than a failed download: an empty report covers \
                     its period only with allow_empty and a header row naming the provider's \
                     columns (JSON lines have none; for a period with no refund, import a CSV \
                     file of that header row alone: {header})"
                ),
            ));
        }
        if let Some((field, column)) = &self.header_lacks {
            return Err(CoordinatorError::invalid(
                format!("columns.{field}"),
                format!(
                    "the report has no line, and its header row has no column {column:?}: an \
                     empty report covers its period only when its header row names every \
                     column of the provider's settings ({header})"
                ),
            ));
        }
        Ok(())
    }

    /// Ends the import: records the period, decides what is left
    /// undecided (an earlier import's cut-off batch, and the settled
    /// refunds of jobs that were live when an import kept them as
    /// observations and have failed or been cancelled since), and raises
    /// MISSING_AT_PROVIDER for succeeded jobs of the covered periods with
    /// no refund, older than the provider's lag. The summary.
    pub async fn finish(mut self) -> Result<ImportSummary, CoordinatorError> {
        let provider = self.settings.provider.clone();
        self.coordinator.metrics.settlement_lines(
            &provider,
            LineCounts::default(),
            self.summary.lines_refused,
        );
        self.taken_any()?;
        if self.header.check_only {
            return Ok(self.summary);
        }
        let (start, end) = self.header.period;
        self.store
            .record_settlement_period(&provider, start, end, &self.header.operator)
            .await?;
        // A settled refund kept as an observation of a job then still
        // live, whose job has failed or been cancelled since: decided again.
        self.store
            .undecide_lines_of_ended_jobs(&self.settings)
            .await?;
        self.decide_undecided(500).await?;
        let mut cursor = MissingCursor::Start;
        while cursor != MissingCursor::Done {
            self.batch_starts().await;
            let (page, next) = self
                .store
                .missing_at_provider(&self.settings, cursor, 500)
                .await?;
            for m in &page {
                let raised = jobfence_store::settlement::Raised {
                    kind: ExceptionKind::MissingAtProvider,
                    job_id: Some(m.job_id),
                    detail: format!(
                        "job {} succeeded at {} and no refund of its key is in {provider}'s reports",
                        m.job_id,
                        m.finished_at.format("%Y-%m-%d %H:%M:%S UTC")
                    ),
                };
                let done = self
                    .store
                    .raise_settlement_exceptions(&provider, &m.operation_key, &[raised], &[])
                    .await?;
                self.summary.decided.exceptions_opened += done.opened;
            }
            self.summary.missing += page.len() as u64;
            cursor = next;
            self.batch_ended().await;
        }
        self.coordinator.refresh_settlement_gauges().await;
        tracing::info!(
            provider = %provider,
            operator = %self.header.operator,
            lines_read = self.summary.lines_read,
            lines_refused = self.summary.lines_refused,
            new = self.summary.lines.new,
            updated = self.summary.lines.updated,
            matched = self.summary.decided.matched,
            resolved = self.summary.decided.resolved.len(),
            exceptions_opened = self.summary.decided.exceptions_opened,
            yielded_seconds = self.summary.pacing.yielded.as_secs_f64(),
            pace = %self.summary.pacing.pace,
            "settlement report imported"
        );
        Ok(self.summary)
    }
}

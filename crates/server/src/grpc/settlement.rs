//! The JobAdmin settlement calls (docs/design.md rule 15): the provider's
//! settings, the streamed import of its report, the report at a glance,
//! the exceptions and a person's action on one. Each handler has the one
//! shape of [`Rpc`]; the import reads its header first (the operator's
//! name, checked against the credential, is in it), then each batch of
//! lines as it arrives.

use super::convert::{duration, duration_to_proto, timestamp};
use super::{NamesOperator, Rpc};
use jobfence_api::v1 as proto;
use jobfence_api::v1::import_settlement_request::Part;
use jobfence_core::settlement::{ImportHeader, ImportPacing, ImportProgress, ImportSummary};
use jobfence_core::Coordinator;
use jobfence_domain::pacing::Pace;
use jobfence_domain::providers::ChangeBy;
use jobfence_domain::settlement::mapping::{AmountUnit, Mapping, RawLine, TimeFormat};
use jobfence_domain::settlement::records::{
    ActOnException, ExceptionList, ProviderSettlement, PutSettlementSettings, QueueAmounts,
    SettlementException, SettlementSettings, DEFAULT_LAG,
};
use jobfence_domain::settlement::ExceptionState;
use jobfence_domain::validate::Violations;
use jobfence_domain::{CoordinatorError, DbTime};
use tonic::{Request, Response, Status, Streaming};

impl NamesOperator for proto::PutSettlementSettingsRequest {
    fn operator(&self) -> &str {
        &self.operator
    }
}

impl NamesOperator for proto::ActOnSettlementExceptionRequest {
    fn operator(&self) -> &str {
        &self.operator
    }
}

/// The mapping of a PutSettlementSettings: the preset's, with every column
/// given over it; without a preset every column is required (checked by
/// the coordinator).
fn mapping(
    v: &mut Violations,
    preset: Option<&str>,
    c: Option<proto::SettlementColumns>,
) -> Mapping {
    let mut m = preset.and_then(Mapping::preset).unwrap_or(Mapping {
        provider_reference: String::new(),
        operation_key: String::new(),
        amount: String::new(),
        amount_unit: AmountUnit::Minor,
        currency: String::new(),
        status: String::new(),
        created: String::new(),
        created_format: TimeFormat::UnixSeconds,
    });
    let c = c.unwrap_or_default();
    for (field, slot, given) in [
        (
            "provider_reference",
            &mut m.provider_reference,
            c.provider_reference,
        ),
        ("operation_key", &mut m.operation_key, c.operation_key),
        ("amount", &mut m.amount, c.amount),
        ("currency", &mut m.currency, c.currency),
        ("status", &mut m.status, c.status),
        ("created", &mut m.created, c.created),
    ] {
        if let Some(g) = v.optional(&format!("columns.{field}"), given) {
            *slot = g;
        }
    }
    if let Some(u) = v.optional("columns.amount_unit", c.amount_unit) {
        match u.parse() {
            Ok(u) => m.amount_unit = u,
            Err(_) => v.add("columns.amount_unit", "must be minor or major"),
        }
    }
    if let Some(f) = v.optional("columns.created_format", c.created_format) {
        match f.parse() {
            Ok(f) => m.created_format = f,
            Err(_) => v.add("columns.created_format", "must be unix or rfc3339"),
        }
    }
    m
}

fn settings_to_proto(s: &SettlementSettings) -> proto::SettlementSettings {
    let m = &s.mapping;
    proto::SettlementSettings {
        provider: s.provider.clone(),
        preset: s.preset.clone().unwrap_or_default(),
        columns: Some(proto::SettlementColumns {
            provider_reference: m.provider_reference.clone(),
            operation_key: m.operation_key.clone(),
            amount: m.amount.clone(),
            amount_unit: m.amount_unit.as_str().into(),
            currency: m.currency.clone(),
            status: m.status.clone(),
            created: m.created.clone(),
            created_format: m.created_format.as_str().into(),
        }),
        lag: Some(duration_to_proto(s.lag)),
        queues: s
            .queues
            .iter()
            .map(|q| proto::QueueAmountPointers {
                queue: q.queue.clone(),
                amount_pointer: q.amount_pointer.clone().unwrap_or_default(),
                currency_pointer: q.currency_pointer.clone().unwrap_or_default(),
            })
            .collect(),
    }
}

/// PutSettlementSettings.
pub(super) async fn put_settings(
    rpc: Rpc<'_>,
    coordinator: &Coordinator,
    request: Request<proto::PutSettlementSettingsRequest>,
) -> Result<Response<proto::PutSettlementSettingsResponse>, Status> {
    rpc.operator(request, |r, operator| async move {
        let mut v = Violations::default();
        let preset = v.optional("preset", r.preset);
        let mapping = mapping(&mut v, preset.as_deref(), r.columns);
        let lag = duration(&mut v, "lag", r.lag).unwrap_or(DEFAULT_LAG);
        let queues = r
            .queues
            .into_iter()
            .enumerate()
            .map(|(i, q)| QueueAmounts {
                queue: q.queue,
                amount_pointer: v
                    .optional(&format!("queues[{i}].amount_pointer"), q.amount_pointer),
                currency_pointer: v
                    .optional(&format!("queues[{i}].currency_pointer"), q.currency_pointer),
            })
            .collect();
        v.finish()?;
        let stored = coordinator
            .put_settlement_settings(PutSettlementSettings {
                provider: r.provider,
                preset,
                mapping,
                lag,
                queues,
                by: ChangeBy {
                    operator,
                    reason: r.reason,
                },
            })
            .await?;
        Ok(proto::PutSettlementSettingsResponse {
            settings: Some(settings_to_proto(&stored)),
        })
    })
    .await
}

fn db_time(v: &mut Violations, field: &str, t: Option<prost_types::Timestamp>) -> DbTime {
    let at = t.and_then(|t| chrono::DateTime::from_timestamp(t.seconds, t.nanos.max(0) as u32));
    match at {
        Some(t) => t.naive_utc(),
        None => {
            v.add(field, "is required (a time)");
            DbTime::default()
        }
    }
}

/// The import's summary as answered.
fn summary_to_proto(s: ImportSummary) -> proto::ImportSettlementResponse {
    proto::ImportSettlementResponse {
        lines_read: s.lines_read,
        lines_refused: s.lines_refused,
        refused: s
            .refusals
            .into_iter()
            .map(|r| proto::RefusedLine {
                line: r.line,
                field: r.field.into(),
                reason: r.why,
            })
            .collect(),
        lines_new: s.lines.new,
        lines_updated: s.lines.updated,
        lines_unchanged: s.lines.unchanged,
        matched: s.decided.matched,
        resolved_job_ids: s.decided.resolved.iter().map(|(id, _)| *id).collect(),
        observed: s.decided.observed,
        undecided: s.decided.undecided,
        exceptions_opened: s.decided.exceptions_opened,
        exceptions_resolved: s.decided.exceptions_resolved,
        missing: s.missing,
        pace: Some(pace_to_proto(&s.pacing)),
    }
}

/// How a paced import went, as answered.
fn pace_to_proto(p: &ImportPacing) -> proto::BackgroundPace {
    let (state, busy) = match p.pace {
        Pace::Alone => (proto::PaceState::Alone, 1.0),
        Pace::Unhindered { .. } => (proto::PaceState::Unhindered, 1.0),
        Pace::Yielding { busy, .. } => (proto::PaceState::Yielding, busy),
    };
    proto::BackgroundPace {
        state: state.into(),
        slower: p.pace.slower(),
        busy,
        yielded: Some(duration_to_proto(p.yielded)),
        probed: Some(duration_to_proto(p.probed)),
        summary: p.pace.to_string(),
    }
}

/// A running import as listed.
fn progress_to_proto(p: ImportProgress) -> proto::SettlementImportProgress {
    let pacing = ImportPacing {
        pace: p.pace,
        yielded: p.yielded,
        probed: std::time::Duration::ZERO,
    };
    let mut pace = pace_to_proto(&pacing);
    pace.probed = None;
    proto::SettlementImportProgress {
        import_id: p.import_id,
        provider: p.provider,
        operator: p.operator,
        running: Some(duration_to_proto(p.running)),
        lines_read: p.lines_read,
        pace: Some(pace),
    }
}

/// ListSettlementImports: this coordinator's running imports.
pub(super) async fn imports(
    rpc: Rpc<'_>,
    coordinator: &Coordinator,
    request: Request<proto::ListSettlementImportsRequest>,
) -> Result<Response<proto::ListSettlementImportsResponse>, Status> {
    rpc.read(request, |r| async move {
        let mut v = Violations::default();
        let provider = v.optional("provider", r.provider);
        let import_id = v.optional("import_id", r.import_id);
        v.finish()?;
        let running = coordinator.settlement_imports(
            provider.as_deref().unwrap_or(""),
            import_id.as_deref().unwrap_or(""),
        );
        Ok(proto::ListSettlementImportsResponse {
            imports: running.into_iter().map(progress_to_proto).collect(),
        })
    })
    .await
}

/// ImportSettlement: the header, then each batch as it arrives.
pub(super) async fn import(
    rpc: Rpc<'_>,
    coordinator: &Coordinator,
    request: Request<Streaming<proto::ImportSettlementRequest>>,
) -> Result<Response<proto::ImportSettlementResponse>, Status> {
    let caller = super::caller(&request);
    let (_, extensions, mut stream) = request.into_parts();
    let first = stream.message().await?;
    let Some(proto::ImportSettlementRequest {
        part: Some(Part::Header(header)),
    }) = first
    else {
        return rpc.answer(Err(CoordinatorError::invalid(
            "header",
            "the first message of an import is its header",
        )));
    };
    super::record_request(&header);
    let operator = rpc.operator_for(caller.as_deref(), &header.operator, &extensions)?;
    let import_id = header.import_id.clone();
    let summary = async {
        let mut v = Violations::default();
        let start = db_time(&mut v, "period_start", header.period_start);
        let end = db_time(&mut v, "period_end", header.period_end);
        v.finish()?;
        let mut import = coordinator
            .start_import(ImportHeader {
                provider: header.provider,
                period: (start, end),
                operator,
                check_only: header.check_only,
                allow_empty: header.allow_empty,
            })
            .await?;
        import.named(&import_id);
        let mut batches = read_ahead(stream);
        while let Some(part) = batches.recv().await {
            match part? {
                Batch::Columns(names) => import.columns(&names)?,
                Batch::Lines(raw) => import.lines(&raw).await?,
            }
        }
        import.finish().await
    }
    .await;
    rpc.answer(summary.map(summary_to_proto))
}

/// A message of an import after its header.
enum Batch {
    /// The report's header row (CSV).
    Columns(Vec<String>),
    Lines(Vec<RawLine>),
}

/// The batches of an import's stream after its header, read and decoded
/// one batch ahead of the one being written: the next message is decoded
/// while the database works on this one. Ends after the last batch, or
/// with the error that ended the stream (a broken stream, or a second
/// header).
fn read_ahead(
    mut stream: Streaming<proto::ImportSettlementRequest>,
) -> tokio::sync::mpsc::Receiver<Result<Batch, CoordinatorError>> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        loop {
            let next = match stream.message().await {
                Ok(None) => return,
                Ok(Some(proto::ImportSettlementRequest {
                    part: Some(Part::Lines(batch)),
                })) => Ok(Batch::Lines(
                    batch
                        .lines
                        .into_iter()
                        .map(|l| RawLine {
                            line: l.line,
                            fields: l.fields.into_iter().collect(),
                            unreadable: l.unreadable.into_iter().collect(),
                        })
                        .collect(),
                )),
                Ok(Some(proto::ImportSettlementRequest {
                    part: Some(Part::Columns(columns)),
                })) => Ok(Batch::Columns(columns.names)),
                Ok(Some(proto::ImportSettlementRequest {
                    part: Some(Part::Abort(abort)),
                })) => Err(CoordinatorError::invalid(
                    "lines",
                    format!(
                        "the importer gave up on its report ({}): no period is \
                         recorded, the lines sent are kept; import the whole report again",
                        abort.reason
                    ),
                )),
                Ok(Some(_)) => Err(CoordinatorError::invalid(
                    "lines",
                    "after the header, every message is the report's columns or a batch of lines",
                )),
                Err(s) => Err(CoordinatorError::invalid(
                    "lines",
                    format!("the import's stream broke: {}", s.message()),
                )),
            };
            let last = next.is_err();
            // The import ended (refused a batch): nobody reads further.
            if tx.send(next).await.is_err() || last {
                return;
            }
        }
    });
    rx
}

fn report_to_proto((s, r): (SettlementSettings, ProviderSettlement)) -> proto::ProviderSettlement {
    proto::ProviderSettlement {
        settings: Some(settings_to_proto(&s)),
        periods: r
            .periods
            .into_iter()
            .map(|p| proto::SettlementPeriod {
                start: Some(timestamp(p.start)),
                end: Some(timestamp(p.end)),
                last_imported_at: Some(timestamp(p.last_imported_at)),
                last_imported_by: p.last_imported_by,
            })
            .collect(),
        lines: r
            .lines
            .into_iter()
            .map(|(status, count)| proto::SettlementLineCount { status, count })
            .collect(),
        matched: r.matched,
        resolved_reviews: r.resolved_reviews,
        exceptions: r
            .exceptions
            .into_iter()
            .map(|(kind, state, count)| proto::SettlementExceptionCount {
                kind: kind.as_str().into(),
                severity: kind.severity().as_str().into(),
                state: state.as_str().into(),
                count,
            })
            .collect(),
        amounts_not_compared: r.amounts_not_compared,
    }
}

/// GetSettlement.
pub(super) async fn get(
    rpc: Rpc<'_>,
    coordinator: &Coordinator,
    request: Request<proto::GetSettlementRequest>,
) -> Result<Response<proto::GetSettlementResponse>, Status> {
    rpc.read(request, |r| async move {
        let mut v = Violations::default();
        let provider = v.optional("provider", r.provider);
        v.finish()?;
        let all = coordinator.settlement_reports(provider.as_deref()).await?;
        Ok(proto::GetSettlementResponse {
            providers: all.into_iter().map(report_to_proto).collect(),
        })
    })
    .await
}

/// An exception as answered.
pub fn exception_to_proto(e: SettlementException) -> proto::SettlementException {
    proto::SettlementException {
        id: e.id,
        provider: e.provider,
        kind: e.kind.as_str().into(),
        severity: e.severity.as_str().into(),
        subject: e.subject,
        job_id: e.job_id.unwrap_or(0),
        detail: e.detail,
        state: e.state.as_str().into(),
        opened_at: Some(timestamp(e.opened_at)),
        updated_at: Some(timestamp(e.updated_at)),
        actions: e
            .actions
            .into_iter()
            .map(|a| proto::SettlementExceptionAction {
                action: a.action,
                operator: a.operator,
                note: a.note,
                acted_at: Some(timestamp(a.acted_at)),
            })
            .collect(),
    }
}

fn exception_state(v: &mut Violations, field: &str, s: &str) -> ExceptionState {
    if !v.not_blank(field, s) {
        return ExceptionState::Open;
    }
    s.parse().unwrap_or_else(|_| {
        v.add(
            field,
            format!("{s:?} is not open, acknowledged or resolved"),
        );
        ExceptionState::Open
    })
}

/// ListSettlementExceptions.
pub(super) async fn list(
    rpc: Rpc<'_>,
    coordinator: &Coordinator,
    request: Request<proto::ListSettlementExceptionsRequest>,
) -> Result<Response<proto::ListSettlementExceptionsResponse>, Status> {
    rpc.read(request, |r| async move {
        let found = if r.id != 0 {
            ExceptionList {
                exceptions: vec![coordinator.settlement_exception(r.id).await?],
                total: 1,
            }
        } else {
            let mut v = Violations::default();
            let provider = v.optional("provider", r.provider);
            let states: Vec<ExceptionState> = r
                .states
                .iter()
                .enumerate()
                .map(|(i, s)| exception_state(&mut v, &format!("states[{i}]"), s))
                .collect();
            v.finish()?;
            let job = (r.job_id != 0).then_some(r.job_id);
            coordinator
                .settlement_exceptions(provider.as_deref(), &states, job, r.limit)
                .await?
        };
        Ok(proto::ListSettlementExceptionsResponse {
            exceptions: found
                .exceptions
                .into_iter()
                .map(exception_to_proto)
                .collect(),
            total: found.total,
        })
    })
    .await
}

/// ActOnSettlementException.
pub(super) async fn act(
    rpc: Rpc<'_>,
    coordinator: &Coordinator,
    request: Request<proto::ActOnSettlementExceptionRequest>,
) -> Result<Response<proto::ActOnSettlementExceptionResponse>, Status> {
    rpc.operator(request, |r, operator| async move {
        let mut v = Violations::default();
        let seen = exception_state(&mut v, "seen_state", &r.seen_state);
        let to = exception_state(&mut v, "to_state", &r.to_state);
        v.finish()?;
        let done = coordinator
            .act_on_settlement_exception(ActOnException {
                id: r.id,
                seen,
                to,
                operator,
                note: r.note,
            })
            .await?;
        Ok(proto::ActOnSettlementExceptionResponse {
            exception: Some(exception_to_proto(done)),
        })
    })
    .await
}

//! Tables and JSON for the operator commands.

use jobfence_api::v1::{self as proto, JobState};
use serde_json::{json, Value};
use std::io::Write;

/// Plain left-aligned columns, two spaces apart.
fn table(out: &mut dyn Write, headers: &[&str], rows: &[Vec<String>]) -> std::io::Result<()> {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        padded.join("  ").trim_end().to_owned()
    };
    writeln!(out, "{}", line(headers.to_vec()))?;
    for row in rows {
        writeln!(out, "{}", line(row.iter().map(String::as_str).collect()))?;
    }
    Ok(())
}

fn state_name(raw: i32) -> String {
    match JobState::try_from(raw) {
        Ok(JobState::Unspecified) | Err(_) => String::new(),
        Ok(s) => s
            .as_str_name()
            .trim_start_matches("JOB_STATE_")
            .to_lowercase(),
    }
}

fn action_name(raw: i32) -> String {
    proto::NextAction::try_from(raw)
        .map(|a| {
            a.as_str_name()
                .trim_start_matches("NEXT_ACTION_")
                .to_lowercase()
        })
        .unwrap_or_default()
}

fn enum_name(raw: &str, prefix: &str) -> String {
    raw.trim_start_matches(prefix).to_lowercase()
}

fn time(t: &Option<prost_types::Timestamp>) -> String {
    t.as_ref()
        .and_then(|t| chrono::DateTime::from_timestamp(t.seconds, t.nanos.max(0) as u32))
        .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_default()
}

fn secs(d: &Option<prost_types::Duration>) -> Option<i64> {
    d.as_ref().map(|d| d.seconds)
}

/// Whole seconds as `1h02m03s`; empty when unset.
fn age(d: &Option<prost_types::Duration>) -> String {
    let Some(s) = secs(d) else {
        return String::new();
    };
    let (h, m, s) = (s / 3600, (s / 60) % 60, s % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m{s:02}s"),
        _ => format!("{h}h{m:02}m{s:02}s"),
    }
}

fn job_json(j: &proto::Job) -> Value {
    json!({
        "job_id": j.job_id,
        "queue": j.queue,
        "operation_key": j.operation_key,
        "payload": j.payload,
        "state": state_name(j.state),
        "attempt": j.attempt,
        "next_action": action_name(j.next_action),
        "run_at": time(&j.run_at),
        "lease_until": time(&j.lease_until),
        "lease_owner": j.lease_owner,
        "first_dispatched_at": time(&j.first_dispatched_at),
        "dispatch_count": j.dispatch_count,
        "provider_reference": j.provider_reference,
        "result": j.result,
        "last_error": j.last_error,
        "state_reason": j.state_reason,
        "created_at": time(&j.created_at),
        "updated_at": time(&j.updated_at),
        "finished_at": time(&j.finished_at),
    })
}

fn event_json(e: &proto::JobEvent) -> Value {
    json!({
        "event_id": e.event_id,
        "job_id": e.job_id,
        "queue": e.queue,
        "operation_key": e.operation_key,
        "attempt": e.attempt,
        "kind": e.kind,
        "from_state": state_name(e.from_state),
        "to_state": state_name(e.to_state),
        "current_attempt": e.current_attempt,
        "detail": e.detail,
        "created_at": time(&e.created_at),
    })
}

fn observation_json(o: &proto::Observation) -> Value {
    let source = proto::ObservationSource::try_from(o.source)
        .map(|s| enum_name(s.as_str_name(), "OBSERVATION_SOURCE_"))
        .unwrap_or_default();
    let outcome = proto::ObservationOutcome::try_from(o.outcome)
        .map(|s| enum_name(s.as_str_name(), "OBSERVATION_OUTCOME_"))
        .unwrap_or_default();
    json!({
        "observation_id": o.observation_id,
        "attempt": o.attempt,
        "source": source,
        "outcome": outcome,
        "provider_reference": o.provider_reference,
        "body": o.body,
        "dedup_key": o.dedup_key,
        "recorded_at": time(&o.recorded_at),
    })
}

fn print_json(out: &mut dyn Write, v: &Value) -> anyhow::Result<()> {
    writeln!(out, "{}", serde_json::to_string_pretty(v)?)?;
    Ok(())
}

fn str_of(v: &Value, key: &str) -> String {
    match &v[key] {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// `jobs list`.
pub fn job_list(
    out: &mut dyn Write,
    page: &proto::ListJobsResponse,
    json: bool,
) -> anyhow::Result<()> {
    if json {
        return print_json(
            out,
            &json!({
                "jobs": page.jobs.iter().map(job_json).collect::<Vec<_>>(),
                "next_page_token": page.next_page_token,
            }),
        );
    }
    let rows: Vec<Vec<String>> = page
        .jobs
        .iter()
        .map(|j| {
            vec![
                j.job_id.to_string(),
                j.queue.clone(),
                state_name(j.state),
                j.attempt.to_string(),
                action_name(j.next_action),
                time(&j.created_at),
                time(&j.updated_at),
                j.operation_key.clone(),
                j.state_reason.clone(),
            ]
        })
        .collect();
    table(
        out,
        &[
            "ID",
            "QUEUE",
            "STATE",
            "ATTEMPT",
            "NEXT",
            "CREATED (UTC)",
            "UPDATED (UTC)",
            "OPERATION_KEY",
            "REASON",
        ],
        &rows,
    )?;
    if !page.next_page_token.is_empty() {
        writeln!(out, "more: --page-token {}", page.next_page_token)?;
    }
    Ok(())
}

/// `jobs show`.
pub fn job_detail(
    out: &mut dyn Write,
    d: &proto::GetJobDetailResponse,
    json: bool,
) -> anyhow::Result<()> {
    let job = d.job.as_ref().map(job_json).unwrap_or(Value::Null);
    if json {
        return print_json(
            out,
            &json!({
                "job": job,
                "observations": d.observations.iter().map(observation_json).collect::<Vec<_>>(),
                "events": d.events.iter().map(event_json).collect::<Vec<_>>(),
            }),
        );
    }
    if let Value::Object(fields) = &job {
        for (k, _) in fields {
            writeln!(out, "{k:<20} {}", str_of(&job, k))?;
        }
    }
    writeln!(out, "\nobservations:")?;
    let rows: Vec<Vec<String>> = d
        .observations
        .iter()
        .map(observation_json)
        .map(|o| {
            [
                "observation_id",
                "attempt",
                "source",
                "outcome",
                "provider_reference",
                "recorded_at",
            ]
            .iter()
            .map(|k| str_of(&o, k))
            .collect()
        })
        .collect();
    table(
        out,
        &[
            "ID",
            "ATTEMPT",
            "SOURCE",
            "OUTCOME",
            "PROVIDER_REF",
            "RECORDED (UTC)",
        ],
        &rows,
    )?;
    writeln!(out, "\nevents:")?;
    event_table(out, &d.events)
}

fn event_table(out: &mut dyn Write, events: &[proto::JobEvent]) -> anyhow::Result<()> {
    let rows: Vec<Vec<String>> = events
        .iter()
        .map(|e| {
            vec![
                e.event_id.to_string(),
                e.job_id.to_string(),
                e.kind.clone(),
                e.attempt.to_string(),
                e.current_attempt.to_string(),
                state_name(e.from_state),
                state_name(e.to_state),
                time(&e.created_at),
                e.detail.clone(),
            ]
        })
        .collect();
    table(
        out,
        &[
            "EVENT", "JOB", "KIND", "ATTEMPT", "CURRENT", "FROM", "TO", "AT (UTC)", "DETAIL",
        ],
        &rows,
    )?;
    Ok(())
}

/// `jobs resolve` and `jobs cancel`.
pub fn written(
    out: &mut dyn Write,
    verb: &str,
    job: Option<&proto::Job>,
    replayed: bool,
    json: bool,
) -> anyhow::Result<()> {
    let Some(job) = job else {
        anyhow::bail!("the server answered without the job");
    };
    if json {
        return print_json(out, &json!({ "job": job_json(job), "replayed": replayed }));
    }
    let again = if replayed {
        " (already applied by this same request)"
    } else {
        ""
    };
    writeln!(
        out,
        "job {} {verb}: now {} (attempt {}){again}",
        job.job_id,
        state_name(job.state),
        job.attempt
    )?;
    Ok(())
}

/// `stats`.
pub fn stats(out: &mut dyn Write, s: &proto::QueueStatsResponse, json: bool) -> anyhow::Result<()> {
    let oldest = |q: &proto::QueueStats, state: JobState| {
        q.oldest.iter().find(|o| o.state == state as i32).cloned()
    };
    if json {
        let queues: Vec<Value> = s
            .queues
            .iter()
            .map(|q| {
                let counts: serde_json::Map<String, Value> = q
                    .counts
                    .iter()
                    .map(|c| (state_name(c.state), json!(c.jobs)))
                    .collect();
                let ages: serde_json::Map<String, Value> = q
                    .oldest
                    .iter()
                    .map(|o| {
                        (
                            state_name(o.state),
                            json!({"age_seconds": secs(&o.age), "job_id": o.job_id}),
                        )
                    })
                    .collect();
                json!({
                    "queue": q.queue,
                    "counts": counts,
                    "oldest_pending": ages,
                    "oldest_unfinished_age_seconds": secs(&q.oldest_unfinished_age),
                    "takeovers": q.takeovers,
                    "stale_write_rejections": q.stale_write_rejections,
                })
            })
            .collect();
        return print_json(
            out,
            &json!({"window_seconds": secs(&s.window), "queues": queues}),
        );
    }
    let count = |q: &proto::QueueStats, state: JobState| {
        q.counts
            .iter()
            .find(|c| c.state == state as i32)
            .map_or(0, |c| c.jobs)
            .to_string()
    };
    let rows: Vec<Vec<String>> = s
        .queues
        .iter()
        .map(|q| {
            vec![
                q.queue.clone(),
                count(q, JobState::Ready),
                count(q, JobState::Running),
                count(q, JobState::ManualReview),
                count(q, JobState::Succeeded),
                count(q, JobState::Failed),
                count(q, JobState::Cancelled),
                age(&oldest(q, JobState::Ready).and_then(|o| o.age)),
                age(&oldest(q, JobState::Running).and_then(|o| o.age)),
                age(&oldest(q, JobState::ManualReview).and_then(|o| o.age)),
                age(&q.oldest_unfinished_age),
                q.takeovers.to_string(),
                q.stale_write_rejections.to_string(),
            ]
        })
        .collect();
    table(
        out,
        &[
            "QUEUE",
            "READY",
            "RUNNING",
            "REVIEW",
            "SUCCEEDED",
            "FAILED",
            "CANCELLED",
            "OLDEST_DUE",
            "OLDEST_RUNNING",
            "OLDEST_REVIEW",
            "OLDEST_UNFINISHED",
            "TAKEOVERS",
            "STALE_REJECTED",
        ],
        &rows,
    )?;
    writeln!(
        out,
        "takeovers and stale rejections over the last {}",
        age(&s.window)
    )?;
    Ok(())
}

/// `events list`.
pub fn event_page(
    out: &mut dyn Write,
    page: &proto::ListEventsResponse,
    json: bool,
) -> anyhow::Result<()> {
    if json {
        return print_json(
            out,
            &json!({
                "events": page.events.iter().map(event_json).collect::<Vec<_>>(),
                "next_after_event_id": page.next_after_event_id,
            }),
        );
    }
    event_table(out, &page.events)?;
    writeln!(out, "next: --after {}", page.next_after_event_id)?;
    Ok(())
}

/// One line of `events watch` (JSON Lines with `--json`).
pub fn event_line(out: &mut dyn Write, e: &proto::JobEvent, json: bool) -> anyhow::Result<()> {
    if json {
        writeln!(out, "{}", event_json(e))?;
    } else {
        writeln!(
            out,
            "{} job={} queue={} kind={} attempt={} {}->{} {}",
            e.event_id,
            e.job_id,
            e.queue,
            e.kind,
            e.attempt,
            state_name(e.from_state),
            state_name(e.to_state),
            e.detail
        )?;
    }
    Ok(())
}

/// A span of time as an operator writes it: `24h`, `1h30m`, `45s`,
/// `250ms`; empty when unset.
fn span(d: &Option<prost_types::Duration>) -> String {
    let Some(d) = d else {
        return String::new();
    };
    let total_ms = d.seconds.max(0) * 1000 + i64::from(d.nanos.max(0)) / 1_000_000;
    if total_ms < 1000 {
        return format!("{total_ms}ms");
    }
    if total_ms < 10_000 && total_ms % 1000 != 0 {
        return format!("{:.1}s", total_ms as f64 / 1000.0);
    }
    let s = total_ms / 1000;
    let (h, m, s) = (s / 3600, (s / 60) % 60, s % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 || out.is_empty() {
        out.push_str(&format!("{s}s"));
    }
    out
}

fn span_seconds(d: &Option<prost_types::Duration>) -> Option<f64> {
    d.as_ref()
        .map(|d| d.seconds as f64 + f64::from(d.nanos) / 1e9)
}

fn pause_name(raw: i32) -> String {
    proto::ProviderPause::try_from(raw)
        .map(|p| enum_name(p.as_str_name(), "PROVIDER_PAUSE_"))
        .unwrap_or_default()
}

fn provider_json(p: &proto::Provider) -> Value {
    let b = p.budget.unwrap_or_default();
    json!({
        "name": p.name,
        "rate_per_second": b.rate_per_second,
        "burst": b.burst,
        "max_in_flight": b.max_in_flight,
        "execute_cost": b.execute_cost.unwrap_or(1),
        "reconcile_cost": b.reconcile_cost.unwrap_or(1),
        "queues": p.queues,
        "pause": pause_name(p.pause),
        "pause_reason": p.pause_reason,
        "throttled_until": time(&p.throttled_until),
        "units_available": p.units_available,
        "next_unit_in_seconds": span_seconds(&p.next_unit_in),
        "in_flight": p.in_flight,
        "throttle_reports": p.throttle_reports,
        "updated_at": time(&p.updated_at),
        "updated_by": p.updated_by,
    })
}

fn provider_table(out: &mut dyn Write, all: &[proto::Provider]) -> anyhow::Result<()> {
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|p| {
            let b = p.budget.unwrap_or_default();
            let pause = match pause_name(p.pause).as_str() {
                "none" => String::new(),
                "sends" => "SENDS".to_owned(),
                other => other.to_uppercase(),
            };
            let in_flight = match b.max_in_flight {
                Some(max) => format!("{}/{max}", p.in_flight),
                None => p.in_flight.to_string(),
            };
            vec![
                p.name.clone(),
                b.rate_per_second.to_string(),
                b.burst.to_string(),
                b.execute_cost.unwrap_or(1).to_string(),
                b.reconcile_cost.unwrap_or(1).to_string(),
                p.queues.join(","),
                format!("{}/{}", p.units_available, b.burst),
                span(&p.next_unit_in),
                in_flight,
                pause,
                time(&p.throttled_until),
                p.updated_by.clone(),
                p.pause_reason.clone(),
            ]
        })
        .collect();
    table(
        out,
        &[
            "PROVIDER",
            "RATE/S",
            "BURST",
            "SEND_COST",
            "RECONCILE_COST",
            "QUEUES",
            "AVAILABLE",
            "NEXT_UNIT",
            "IN_FLIGHT",
            "PAUSED",
            "THROTTLED_UNTIL (UTC)",
            "CHANGED_BY",
            "PAUSE_REASON",
        ],
        &rows,
    )?;
    Ok(())
}

/// `providers list`.
pub fn providers(out: &mut dyn Write, all: &[proto::Provider], json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(
            out,
            &json!({ "providers": all.iter().map(provider_json).collect::<Vec<_>>() }),
        );
    }
    if all.is_empty() {
        writeln!(
            out,
            "no providers: every queue is unlimited (jobfence providers set NAME --rate R --burst B --queue Q --reason …)"
        )?;
        return Ok(());
    }
    provider_table(out, all)?;
    writeln!(
        out,
        "AVAILABLE: units that could be spent now, of the burst (database clock); IN_FLIGHT: running with a live lease[/cap]"
    )?;
    Ok(())
}

/// `providers set|delete|pause|resume`: what the change did, then the
/// provider as stored (as it was, for a delete).
pub fn provider_changed(
    out: &mut dyn Write,
    verb: &str,
    provider: Option<&proto::Provider>,
    json: bool,
) -> anyhow::Result<()> {
    let Some(p) = provider else {
        anyhow::bail!("the server answered without the provider");
    };
    if json {
        return print_json(
            out,
            &json!({ "action": verb, "provider": provider_json(p) }),
        );
    }
    let queues = if p.queues.is_empty() {
        "no queues".to_owned()
    } else {
        format!("queues {}", p.queues.join(", "))
    };
    let what = match (verb, pause_name(p.pause).as_str()) {
        ("deleted", _) => format!("{queues} no longer limited"),
        ("paused", "sends") => "sends held, reconciles go on".to_owned(),
        ("paused", _) => "nothing is handed out".to_owned(),
        ("resumed", _) => "hand-outs go on within the budget".to_owned(),
        _ => {
            let b = p.budget.unwrap_or_default();
            format!("{}/s, burst {}, for {queues}", b.rate_per_second, b.burst)
        }
    };
    writeln!(out, "provider {} {verb}: {what}", p.name)?;
    provider_table(out, std::slice::from_ref(p))
}

fn queue_policy_json(q: &proto::QueuePolicy) -> Value {
    json!({
        "queue": q.queue,
        "provider": q.provider,
        "resend_window_seconds": secs(&q.resend_window),
        "max_dispatches": q.max_dispatches,
        "job_retention_seconds": secs(&q.job_retention),
        "updated_at": time(&q.updated_at),
        "updated_by": q.updated_by,
    })
}

fn queue_policy_rows(all: &[proto::QueuePolicy]) -> Vec<Vec<String>> {
    all.iter()
        .map(|q| {
            let stored = q.resend_window.is_some();
            vec![
                q.queue.clone(),
                q.provider.clone(),
                if stored {
                    span(&q.resend_window)
                } else {
                    "(flags)".to_owned()
                },
                q.max_dispatches
                    .map_or_else(|| "(flags)".to_owned(), |n| n.to_string()),
                if q.job_retention.is_some() {
                    span(&q.job_retention)
                } else {
                    "(flags)".to_owned()
                },
                time(&q.updated_at),
                q.updated_by.clone(),
            ]
        })
        .collect()
}

const QUEUE_POLICY_HEADERS: [&str; 7] = [
    "QUEUE",
    "PROVIDER",
    "RESEND_WINDOW",
    "MAX_DISPATCHES",
    "RETENTION",
    "CHANGED (UTC)",
    "CHANGED_BY",
];

/// `queue-policies list`.
pub fn queue_policies(
    out: &mut dyn Write,
    all: &[proto::QueuePolicy],
    json: bool,
) -> anyhow::Result<()> {
    if json {
        return print_json(
            out,
            &json!({ "policies": all.iter().map(queue_policy_json).collect::<Vec<_>>() }),
        );
    }
    table(out, &QUEUE_POLICY_HEADERS, &queue_policy_rows(all))?;
    writeln!(
        out,
        "(flags): no stored resend policy; each coordinator's --resend-window / --max-dispatches apply. Queues not listed: no provider, flags."
    )?;
    Ok(())
}

/// `queue-policies set|delete`.
pub fn queue_policy_changed(
    out: &mut dyn Write,
    verb: &str,
    policy: Option<&proto::QueuePolicy>,
    json: bool,
) -> anyhow::Result<()> {
    let Some(q) = policy else {
        anyhow::bail!("the server answered without the policy");
    };
    if json {
        return print_json(
            out,
            &json!({ "action": verb, "policy": queue_policy_json(q) }),
        );
    }
    let what = if verb == "deleted" {
        "the coordinators' --resend-window / --max-dispatches flags apply again".to_owned()
    } else {
        format!(
            "resend window {}, at most {} dispatches, on every coordinator",
            span(&q.resend_window),
            q.max_dispatches.unwrap_or_default()
        )
    };
    writeln!(out, "policy of queue {} {verb}: {what}", q.queue)?;
    table(
        out,
        &QUEUE_POLICY_HEADERS,
        &queue_policy_rows(std::slice::from_ref(q)),
    )?;
    Ok(())
}

/// `providers history` and `queue-policies history`, newest first.
pub fn policy_changes(
    out: &mut dyn Write,
    page: &proto::ListPolicyChangesResponse,
    limit: u32,
    json: bool,
) -> anyhow::Result<()> {
    let full = limit > 0 && page.changes.len() >= limit as usize;
    let next = page.changes.last().filter(|_| full).map(|c| c.change_id);
    if json {
        let changes: Vec<Value> = page
            .changes
            .iter()
            .map(|c| {
                json!({
                    "change_id": c.change_id,
                    "changed_at": time(&c.changed_at),
                    "operator": c.operator,
                    "subject": c.subject,
                    "action": c.action,
                    "reason": c.reason,
                    "detail": serde_json::from_str::<Value>(&c.detail)
                        .unwrap_or_else(|_| Value::String(c.detail.clone())),
                })
            })
            .collect();
        return print_json(out, &json!({ "changes": changes, "next_before": next }));
    }
    let rows: Vec<Vec<String>> = page
        .changes
        .iter()
        .map(|c| {
            vec![
                c.change_id.to_string(),
                time(&c.changed_at),
                c.operator.clone(),
                c.subject.clone(),
                c.action.clone(),
                c.reason.clone(),
                c.detail.clone(),
            ]
        })
        .collect();
    table(
        out,
        &[
            "CHANGE", "AT (UTC)", "OPERATOR", "SUBJECT", "ACTION", "REASON", "DETAIL",
        ],
        &rows,
    )?;
    if let Some(id) = next {
        writeln!(out, "more: --before {id}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns() {
        let mut out = Vec::new();
        table(
            &mut out,
            &["ID", "STATE"],
            &[
                vec!["1".into(), "ready".into()],
                vec!["123".into(), "x".into()],
            ],
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "ID   STATE\n1    ready\n123  x\n"
        );
    }

    #[test]
    fn ages_read_as_hours_minutes_seconds() {
        let d = |s| {
            Some(prost_types::Duration {
                seconds: s,
                nanos: 0,
            })
        };
        assert_eq!(age(&d(59)), "59s");
        assert_eq!(age(&d(61)), "1m01s");
        assert_eq!(age(&d(3723)), "1h02m03s");
        assert_eq!(age(&None), "");
    }

    #[test]
    fn spans_read_as_an_operator_writes_them() {
        let d = |seconds, nanos| Some(prost_types::Duration { seconds, nanos });
        assert_eq!(span(&d(86_400, 0)), "24h");
        assert_eq!(span(&d(5_400, 0)), "1h30m");
        assert_eq!(span(&d(45, 0)), "45s");
        assert_eq!(span(&d(0, 250_000_000)), "250ms");
        assert_eq!(span(&d(1, 500_000_000)), "1.5s");
        assert_eq!(span(&d(0, 0)), "0ms");
        assert_eq!(span(&None), "");
    }
}

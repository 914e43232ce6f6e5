//! Repair in bulk from the console, as `jobfence jobs bulk` does it: pick
//! the action and the jobs (queue, operation-key prefix, age, parked
//! reason), see how many and which first (nothing changed), then confirm.
//! The jobs counted go to the coordinator's BulkRepair in batches of
//! [`BULK_BATCH`], each job checked as its single action would be, on the
//! attempt the selection saw: cancel (CancelJob: ready jobs never sent),
//! fail or requeue (ResolveManualReview to failed or to a reconcile:
//! parked jobs). A job that moved meanwhile is refused by its fence,
//! skipped and counted, never overwritten; each applied one is recorded
//! with the operator's name and reason.

use super::{bad_input, refusal};
use crate::forms::{self, query_string, Pairs};
use crate::operator::OperatorField;
use crate::view::{self, job_link, Level, Nav, Notice};
use crate::{csrf, Console};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Form;
use jobfence_domain::admin::{
    fence, BulkAction, BulkRepair, CountedJob, ListJobsFilter, BULK_BATCH,
};
use jobfence_domain::{CoordinatorError, FieldViolation, Job, JobState};
use maud::{html, Markup};
use std::time::Duration;

/// The actions, as the form names them, with what each does.
const ACTIONS: [(&str, &str); 3] = [
    ("cancel", "Cancel ready jobs never sent"),
    ("fail", "Resolve parked jobs to failed (no refund)"),
    ("requeue", "Resolve parked jobs to ready, reconcile first"),
];

/// The reasons a job is parked for, as `Parked for` takes them.
const REASON_CODES: [&str; 3] = [
    "RESEND_WINDOW_CLOSED",
    "MAX_DISPATCHES_REACHED",
    jobfence_domain::MANUAL_REVIEW_REQUESTED,
];

/// Most jobs one confirmation acts on (the CLI's `--max` without `--yes`).
const MAX_JOBS: usize = 1000;

/// What to select, from the query string or the form.
struct Selection {
    action: &'static str,
    queue: String,
    key_prefix: String,
    older_than: Option<Duration>,
    reason_code: String,
}

impl Selection {
    fn parse(pairs: &Pairs) -> Result<Option<Selection>, Vec<FieldViolation>> {
        let Some(raw) = forms::value(pairs, "action").filter(|a| !a.is_empty()) else {
            return Ok(None);
        };
        let mut bad = Vec::new();
        let violation = |field: &str, description: &str| FieldViolation {
            field: field.into(),
            description: description.into(),
        };
        let action = ACTIONS.iter().map(|a| a.0).find(|a| *a == raw);
        if action.is_none() {
            bad.push(violation("action", "must be cancel, fail or requeue"));
        }
        let text = |k| forms::value(pairs, k).unwrap_or("").trim().to_owned();
        let queue = text("queue");
        if queue.is_empty() {
            bad.push(violation("queue", "pick a queue (one at a time)"));
        }
        let older_than = match text("older_than").as_str() {
            "" => None,
            d => match forms::duration(d) {
                Ok(d) => Some(d),
                Err(e) => {
                    bad.push(violation("older_than", &e));
                    None
                }
            },
        };
        let reason_code = text("reason_code");
        if !reason_code.is_empty() && !REASON_CODES.contains(&reason_code.as_str()) {
            bad.push(violation(
                "reason_code",
                &format!("must be one of {}", REASON_CODES.join(", ")),
            ));
        }
        if !bad.is_empty() {
            return Err(bad);
        }
        Ok(Some(Selection {
            action: action.unwrap_or("cancel"),
            queue,
            key_prefix: text("key_prefix"),
            older_than,
            reason_code,
        }))
    }

    fn state(&self) -> JobState {
        if self.action == "cancel" {
            JobState::Ready
        } else {
            JobState::ManualReview
        }
    }

    fn matches(&self, j: &Job) -> bool {
        let code = self.reason_code.is_empty()
            || j.state_reason.as_deref().unwrap_or("") == self.reason_code;
        code && (self.action != "cancel" || j.dispatch_count == 0)
    }

    /// The selected jobs now, `(id, attempt)`, oldest first. A queue with
    /// no job at all is refused (a typo acts on nothing: say so).
    async fn select(&self, console: &Console) -> Result<Vec<(u64, u64)>, CoordinatorError> {
        let (known, _) = console
            .coordinator
            .queue_stats(Some(self.queue.clone()), None)
            .await?;
        if known.is_empty() {
            return Err(CoordinatorError::InvalidArgument(vec![FieldViolation {
                field: "queue".into(),
                description: format!("no job is in queue {:?}", self.queue),
            }]));
        }
        let mut out = Vec::new();
        let mut after_id = 0;
        loop {
            let filter = ListJobsFilter {
                queue: Some(self.queue.clone()),
                states: vec![self.state()],
                min_age: self.older_than,
                operation_key: Some(self.key_prefix.clone()).filter(|p| !p.is_empty()),
                after_id,
                limit: 500,
            };
            let (jobs, next) = console.coordinator.list_jobs(filter).await?;
            out.extend(
                jobs.iter()
                    .filter(|j| self.matches(j))
                    .map(|j| (j.id, j.attempt)),
            );
            match next {
                Some(n) if out.len() <= MAX_JOBS => after_id = n,
                _ => return Ok(out),
            }
        }
    }

    fn hidden(&self) -> Markup {
        let older = self
            .older_than
            .map(|d| humantime::format_duration(d).to_string())
            .unwrap_or_default();
        html! {
            input type="hidden" name="action" value=(self.action);
            input type="hidden" name="queue" value=(self.queue);
            input type="hidden" name="key_prefix" value=(self.key_prefix);
            input type="hidden" name="older_than" value=(older);
            input type="hidden" name="reason_code" value=(self.reason_code);
        }
    }
}

/// The selection form (a GET: it changes nothing).
fn chooser(pairs: &Pairs) -> Markup {
    let v = |k| forms::value(pairs, k).unwrap_or("");
    html! {
        form.bulk-select method="get" action="/jobs/bulk" {
            div.row {
                label { "Action" select name="action" {
                    @for (a, what) in ACTIONS { option value=(a) selected[v("action") == a] { (what) } }
                } }
                label { "Queue" input type="text" name="queue" value=(v("queue")) required size="14"; }
                label { "Key starts with" input type="text" name="key_prefix" value=(v("key_prefix")) size="18"; }
                label { "Older than" input type="text" name="older_than" value=(v("older_than")) placeholder="e.g. 2h" size="6"; }
                label { "Parked for" input type="text" name="reason_code" value=(v("reason_code")) placeholder="e.g. RESEND_WINDOW_CLOSED" size="22"; }
            }
            button type="submit" { "Count (dry run)" }
        }
    }
}

/// The count, the first jobs, and the confirmation form.
fn confirm(sel: &Selection, jobs: &[(u64, u64)], token: &str, operator: &OperatorField) -> Markup {
    let what = ACTIONS
        .iter()
        .find(|a| a.0 == sel.action)
        .map_or("", |a| a.1);
    html! {
        section.card.bulk-count data-selected=(jobs.len()) {
            h2 { (jobs.len()) @if jobs.len() == 1 { " job" } @else { " jobs" } " selected" span.muted { " (dry run: nothing changed)" } }
            @if !jobs.is_empty() {
                p { "First: " @for (id, _) in jobs.iter().take(10) { (job_link(*id)) " " } }
            }
            @if jobs.len() > MAX_JOBS {
                p.notice.warn { "More than " (MAX_JOBS) ": narrow the selection, or use `jobfence jobs bulk … --yes`." }
            } @else if !jobs.is_empty() {
                form.bulk-apply method="post" action="/jobs/bulk" {
                    input type="hidden" name=(csrf::FIELD) value=(token);
                    (sel.hidden())
                    // Exactly the jobs counted, each with the attempt seen.
                    input type="hidden" name="jobs" value=(jobs.iter().map(|(id, a)| format!("{id}:{a}")).collect::<Vec<_>>().join(","));
                    div.row {
                        @match operator {
                            OperatorField::Typed(remembered) => {
                                label { "Your name" input type="text" name="operator" value=(remembered.as_deref().unwrap_or("")) required size="16"; }
                            }
                            OperatorField::Fixed(name) => {
                                span.muted.as-operator { "Recorded as " strong { (name) } }
                            }
                        }
                        label.grow { "Reason (recorded on every job)" input type="text" name="reason" required; }
                    }
                    button.danger type="submit" { (what) ": " (jobs.len()) " jobs" }
                }
            }
        }
    }
}

fn respond(
    status: StatusCode,
    notices: &[Notice],
    body: Markup,
    set: Option<axum::http::HeaderValue>,
) -> Response {
    let body = html! {
        div.page-head { h1 { "Repair in bulk" } }
        p.muted { "Each job through the same fenced write as on its own page; a job that moved meanwhile is skipped and counted, never overwritten." }
        (body)
    };
    view::respond(
        status,
        view::page("Repair in bulk", Nav::Jobs, notices, body),
        [set],
    )
}

/// `GET /jobs/bulk`: the form, and with a selection its count.
pub async fn page(
    State(console): State<Console>,
    headers: HeaderMap,
    Query(q): Query<Pairs>,
) -> Response {
    let (token, set) = csrf::ensure(&headers);
    let sel = match Selection::parse(&q) {
        Ok(Some(sel)) => sel,
        Ok(None) => return respond(StatusCode::OK, &[], chooser(&q), set),
        Err(bad) => {
            return respond(
                StatusCode::BAD_REQUEST,
                &[bad_input(&bad)],
                chooser(&q),
                set,
            )
        }
    };
    match sel.select(&console).await {
        Ok(jobs) => {
            let body = html! { (chooser(&q)) (confirm(&sel, &jobs, &token, &console.operator_field(&headers))) };
            respond(StatusCode::OK, &[], body, set)
        }
        Err(e) => {
            let (status, n) = refusal(&e);
            respond(status, &[n], chooser(&q), set)
        }
    }
}

/// `POST /jobs/bulk`: select again, and act on each job, fenced.
pub async fn post(
    State(console): State<Console>,
    headers: HeaderMap,
    Form(pairs): Form<Pairs>,
) -> Response {
    let who = match super::job_poster(&console, &headers, &pairs, "Nothing changed") {
        Ok(who) => who,
        Err((status, n)) => return respond(status, &[n], chooser(&pairs), None),
    };
    let (sel, jobs) = match Selection::parse(&pairs).and_then(|sel| Ok((sel, counted(&pairs)?))) {
        Ok((Some(sel), jobs)) => (sel, jobs),
        Ok((None, _)) => {
            let bad = [FieldViolation {
                field: "action".into(),
                description: "must be cancel, fail or requeue".into(),
            }];
            return respond(
                StatusCode::BAD_REQUEST,
                &[bad_input(&bad)],
                chooser(&pairs),
                None,
            );
        }
        Err(bad) => {
            return respond(
                StatusCode::BAD_REQUEST,
                &[bad_input(&bad)],
                chooser(&pairs),
                None,
            )
        }
    };
    let reason = forms::value(&pairs, "reason").unwrap_or("");
    let (applied, skipped) = match send(&console, sel.action, &jobs, &who.name, reason).await {
        Sent::Done { applied, skipped } => (applied, skipped),
        Sent::Refused(v) => {
            return respond(
                StatusCode::BAD_REQUEST,
                &[bad_input(&v)],
                chooser(&pairs),
                None,
            )
        }
        Sent::Stopped {
            applied,
            skipped,
            error,
        } => {
            let n = Notice::new(
                Level::Error,
                format!("Stopped after {applied} applied, {skipped} skipped: {error}."),
            );
            return respond(StatusCode::CONFLICT, &[n], chooser(&pairs), None);
        }
    };
    let n = Notice::new(
        Level::Ok,
        format!(
            "{} selected: {applied} applied, {skipped} skipped (moved meanwhile).",
            jobs.len()
        ),
    );
    let back = query_string(&[("queue", &sel.queue)]);
    let body =
        html! { p { a href={ "/jobs?" (back) } { "The queue's jobs →" } } (chooser(&pairs)) };
    respond(StatusCode::OK, &[n], body, None)
}

/// The jobs the confirmation carries (`id:attempt,…`: exactly those the
/// count showed, each with the attempt seen); at most [`MAX_JOBS`].
fn counted(pairs: &Pairs) -> Result<Vec<(u64, u64)>, Vec<FieldViolation>> {
    let bad = |description: &str| {
        vec![FieldViolation {
            field: "jobs".into(),
            description: description.into(),
        }]
    };
    let raw = forms::value(pairs, "jobs").unwrap_or("");
    let jobs: Option<Vec<(u64, u64)>> = raw
        .split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (id, attempt) = p.split_once(':')?;
            Some((id.parse().ok()?, attempt.parse().ok()?))
        })
        .collect();
    match jobs {
        None => Err(bad("must be the jobs the count showed, as id:attempt")),
        Some(j) if j.is_empty() => Err(bad("no job was counted: count again")),
        Some(j) if j.len() > MAX_JOBS => Err(bad(&format!(
            "more than {MAX_JOBS}: narrow the selection, or use `jobfence jobs bulk … --yes`"
        ))),
        Some(j) => Ok(j),
    }
}

/// What the batches of a confirmation did.
enum Sent {
    /// Every batch answered: jobs applied, and skipped (moved meanwhile).
    Done { applied: usize, skipped: usize },
    /// The first batch was refused as a whole, nothing written.
    Refused(Vec<FieldViolation>),
    /// A job failed for another reason than its fence (not found, the
    /// database unavailable): no further batch was sent.
    Stopped {
        applied: usize,
        skipped: usize,
        error: CoordinatorError,
    },
}

/// Sends `jobs` to BulkRepair in batches of [`BULK_BATCH`], in order.
async fn send(
    console: &Console,
    action_name: &str,
    jobs: &[(u64, u64)],
    operator: &str,
    reason: &str,
) -> Sent {
    let (mut applied, mut skipped) = (0, 0);
    for batch in jobs.chunks(BULK_BATCH) {
        let call = BulkRepair {
            action: action(action_name),
            jobs: batch
                .iter()
                .map(|&(job_id, attempt)| CountedJob { job_id, attempt })
                .collect(),
            operator: operator.to_owned(),
            reason: reason.to_owned(),
        };
        let failure = match console.coordinator.bulk_repair(call).await {
            Ok(out) => {
                applied += out.applied();
                skipped += out.skipped();
                out.results
                    .into_iter()
                    .find_map(|(_, r)| r.err().filter(|e| !fence::moved(e)))
            }
            Err(e) => Some(e),
        };
        match failure {
            None => {}
            Some(CoordinatorError::InvalidArgument(v)) => return Sent::Refused(v),
            Some(error) => {
                return Sent::Stopped {
                    applied,
                    skipped,
                    error,
                }
            }
        }
    }
    Sent::Done { applied, skipped }
}

/// The action a form names (parsed by [`Selection::parse`]).
fn action(name: &str) -> BulkAction {
    match name {
        "cancel" => BulkAction::Cancel,
        "fail" => BulkAction::Fail,
        _ => BulkAction::Requeue,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::forms::pairs_of as pairs;

    #[test]
    fn a_selection_names_each_bad_field() {
        assert!(
            Selection::parse(&pairs(&[])).unwrap().is_none(),
            "no action: the form alone"
        );
        let bad = Selection::parse(&pairs(&[
            ("action", "delete"),
            ("queue", " "),
            ("older_than", "soon"),
        ]))
        .err()
        .unwrap();
        let fields: Vec<&str> = bad.iter().map(|v| v.field.as_str()).collect();
        assert_eq!(fields, ["action", "queue", "older_than"]);
        let ok = Selection::parse(&pairs(&[
            ("action", "requeue"),
            ("queue", "refunds"),
            ("older_than", "2h"),
            ("reason_code", "REQUESTED"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((ok.action, ok.state()), ("requeue", JobState::ManualReview));
        assert_eq!(ok.older_than, Some(Duration::from_secs(7200)));
        let bogus = Selection::parse(&pairs(&[
            ("action", "fail"),
            ("queue", "refunds"),
            ("reason_code", "BOGUS"),
        ]));
        assert_eq!(bogus.err().unwrap()[0].field, "reason_code");
    }

    #[test]
    fn a_confirmation_acts_on_exactly_the_jobs_it_counted() {
        let jobs = |v: &str| counted(&pairs(&[("jobs", v)]));
        assert_eq!(jobs("12:1,13:0").unwrap(), [(12, 1), (13, 0)]);
        for bad in ["", "12", "12:x", "12:1,,x:1"] {
            assert_eq!(jobs(bad).unwrap_err()[0].field, "jobs", "{bad:?}");
        }
        let many: Vec<String> = (1..=1001).map(|i| format!("{i}:0")).collect();
        assert!(jobs(&many.join(",")).unwrap_err()[0]
            .description
            .starts_with("more than 1000"));
    }
}

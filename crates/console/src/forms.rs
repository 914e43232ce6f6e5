//! Query strings and form posts, turned into the coordinator's requests.
//!
//! Everything arrives as name/value pairs and is parsed here, not by an
//! extractor, so that a bad value becomes a message on the page naming the
//! field ("older_than: \"5 parsecs\" is not a duration …") rather than a
//! bare 400. The limits themselves (queue names, key lengths, delays) are
//! the coordinator's, checked where `JobAdmin`'s are.

use jobfence_domain::admin::{ListJobsFilter, Resolution, ResolveManualReview};
use jobfence_domain::budget::{Budget, Pause};
use jobfence_domain::FieldViolation;
use jobfence_domain::JobState;

use std::time::Duration;

/// A query string or a form body, in order.
pub type Pairs = Vec<(String, String)>;

/// Rows on one page of the Jobs list.
pub const JOBS_PAGE: u32 = 50;
/// Jobs on one page of the Manual review list.
pub const REVIEW_PAGE: u32 = 20;
/// The Queues page's window when none is chosen.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(3600);

/// The last value of `key`, trimmed; `None` when absent or blank.
pub fn value<'a>(pairs: &'a Pairs, key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

/// Every non-blank value of `key`, in order.
pub fn values<'a>(pairs: &'a Pairs, key: &'a str) -> impl Iterator<Item = &'a str> {
    pairs
        .iter()
        .filter(move |(k, _)| k == key)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

/// A job state as written in a URL: `manual_review`, `manual-review`, any case.
pub fn state(raw: &str) -> Result<JobState, String> {
    let norm = raw.trim().to_ascii_lowercase().replace('-', "_");
    norm.parse().map_err(|_| {
        let known: Vec<&str> = JobState::ALL.iter().map(|s| s.as_str()).collect();
        format!(
            "{raw:?} is not a job state; use one of {}",
            known.join(", ")
        )
    })
}

/// A duration as a person writes it: `90s`, `10m`, `4h`, `2d`, `1h 30m`.
pub fn duration(raw: &str) -> Result<Duration, String> {
    humantime::parse_duration(raw.trim())
        .map_err(|_| format!("{raw:?} is not a duration; write e.g. 90s, 10m, 4h or 2d"))
}

/// A job id from a path or a field.
pub fn job_id(raw: &str) -> Result<u64, String> {
    match raw.trim().parse::<u64>() {
        Ok(id) if id > 0 => Ok(id),
        _ => Err(format!("{raw:?} is not a job id (a whole number from 1)")),
    }
}

fn number(v: &mut Vec<FieldViolation>, pairs: &Pairs, key: &str) -> u64 {
    match value(pairs, key) {
        None => 0,
        Some(raw) => raw.parse().unwrap_or_else(|_| {
            v.push(FieldViolation::new(
                key,
                format!("{raw:?} is not a whole number"),
            ));
            0
        }),
    }
}

/// The Jobs page's filter: `queue`, `state` (repeatable), `older_than`,
/// `operation_key` (a prefix), `after` (the keyset cursor), `limit`
/// (rows per page, `default_limit` when absent).
pub fn jobs_filter(pairs: &Pairs, default_limit: u32) -> (ListJobsFilter, Vec<FieldViolation>) {
    let mut v = Vec::new();
    let limit = match number(&mut v, pairs, "limit") {
        0 => default_limit,
        n => u32::try_from(n).unwrap_or(u32::MAX),
    };
    let mut states = Vec::new();
    for raw in values(pairs, "state") {
        if raw == "any" {
            continue;
        }
        match state(raw) {
            Ok(s) if !states.contains(&s) => states.push(s),
            Ok(_) => {}
            Err(e) => v.push(FieldViolation::new("state", e)),
        }
    }
    let min_age = value(pairs, "older_than").and_then(|raw| match duration(raw) {
        Ok(d) => Some(d),
        Err(e) => {
            v.push(FieldViolation::new("older_than", e));
            None
        }
    });
    let filter = ListJobsFilter {
        queue: value(pairs, "queue").map(str::to_owned),
        states,
        min_age,
        operation_key: value(pairs, "operation_key").map(str::to_owned),
        after_id: number(&mut v, pairs, "after"),
        limit,
    };
    (filter, v)
}

/// The Queues page's window (`window`, default [`DEFAULT_WINDOW`]).
pub fn window(pairs: &Pairs) -> Result<Duration, FieldViolation> {
    match value(pairs, "window") {
        None => Ok(DEFAULT_WINDOW),
        Some(raw) => duration(raw).map_err(|e| FieldViolation::new("window", e)),
    }
}

/// A list of events cursors under `key` (numbers separated by commas,
/// one per database of the coordinator), if given.
pub fn cursors(pairs: &Pairs, key: &str) -> Result<Option<Vec<u64>>, FieldViolation> {
    let Some(raw) = value(pairs, key) else {
        return Ok(None);
    };
    raw.split(',')
        .map(|c| c.trim().parse::<u64>())
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
        .map_err(|_| {
            FieldViolation::new(
                key,
                format!("{raw:?} is not a list of event ids (numbers separated by commas)"),
            )
        })
}

/// A cursor (a number) under `key`, if given.
pub fn cursor(pairs: &Pairs, key: &str) -> Result<Option<u64>, FieldViolation> {
    let mut v = Vec::new();
    let n = number(&mut v, pairs, key);
    match v.pop() {
        Some(bad) => Err(bad),
        None => Ok(value(pairs, key).map(|_| n)),
    }
}

/// A resolution form: `attempt` (the one the operator saw), `resolution`,
/// `provider_reference`, `result`, `delay`, `authorize_resend`, `reason`;
/// `operator` is the name the form was posted under. Returns the request
/// and whether a resend was authorized, or every bad field.
pub fn resolve_request(
    job_id: u64,
    operator: &str,
    pairs: &Pairs,
) -> Result<(ResolveManualReview, bool), Vec<FieldViolation>> {
    let mut v = Vec::new();
    let attempt = match value(pairs, "attempt").map(str::parse::<u64>) {
        Some(Ok(a)) => a,
        _ => {
            v.push(FieldViolation::new(
                "attempt",
                "is missing: reload the page and resolve from the form it shows",
            ));
            0
        }
    };
    let mut delay = || match value(pairs, "delay") {
        None => Duration::ZERO,
        Some(raw) => duration(raw).unwrap_or_else(|e| {
            v.push(FieldViolation::new("delay", e));
            Duration::ZERO
        }),
    };
    let resolution = match value(pairs, "resolution") {
        Some("succeeded") => Some(Resolution::Succeeded {
            provider_reference: value(pairs, "provider_reference")
                .unwrap_or_default()
                .to_owned(),
            result: value(pairs, "result").map(str::to_owned),
        }),
        Some("failed") => Some(Resolution::Failed),
        Some("retry_reconcile") => Some(Resolution::RetryReconcile { delay: delay() }),
        Some("retry_execute") => Some(Resolution::RetryExecute { delay: delay() }),
        Some(other) => {
            v.push(FieldViolation::new(
                "resolution",
                format!("{other:?} is not a resolution"),
            ));
            None
        }
        None => {
            v.push(FieldViolation::new(
                "resolution",
                "choose what happened: succeeded, failed, retry with reconcile, or resend",
            ));
            None
        }
    };
    let authorize = value(pairs, "authorize_resend").is_some();
    match resolution {
        Some(resolution) if v.is_empty() => Ok((
            ResolveManualReview {
                job_id,
                attempt,
                resolution,
                operator: operator.to_owned(),
                reason: value(pairs, "reason").unwrap_or_default().to_owned(),
            },
            authorize,
        )),
        _ => Err(v),
    }
}

/// A whole number field of a form: `None` when blank, a violation when not
/// a number from 0 to u32::MAX.
fn count(v: &mut Vec<FieldViolation>, pairs: &Pairs, key: &str) -> Option<u32> {
    let raw = value(pairs, key)?;
    match raw.parse::<u32>() {
        Ok(n) => Some(n),
        Err(_) => {
            v.push(FieldViolation::new(
                key,
                format!("{raw:?} is not a whole number of units"),
            ));
            None
        }
    }
}

/// A budget form: `rate_per_second` and `burst` (required),
/// `max_in_flight` (blank: no cap), `execute_cost` and `reconcile_cost`
/// (blank: 1), and `queues` (names separated by commas or spaces). Returns
/// the budget and the queues, or every field that is not even a number;
/// the limits (positive rate, burst at least the costs, queue names) are
/// the coordinator's, checked as for `PutProvider`.
pub fn budget(pairs: &Pairs) -> Result<(Budget, Vec<String>), Vec<FieldViolation>> {
    let mut v = Vec::new();
    let rate = match value(pairs, "rate_per_second") {
        None => {
            v.push(FieldViolation::new(
                "rate_per_second",
                "is required: units per second, e.g. 80 (or 0.5 for one every 2 s)",
            ));
            0.0
        }
        Some(raw) => raw.parse::<f64>().unwrap_or_else(|_| {
            v.push(FieldViolation::new(
                "rate_per_second",
                format!("{raw:?} is not a number of units per second (e.g. 80 or 0.5)"),
            ));
            0.0
        }),
    };
    let burst = count(&mut v, pairs, "burst");
    if value(pairs, "burst").is_none() {
        v.push(FieldViolation::new(
            "burst",
            "is required: units that may be spent at once, e.g. 100",
        ));
    }
    let budget = Budget {
        rate_per_second: rate,
        burst: burst.unwrap_or(0),
        max_in_flight: count(&mut v, pairs, "max_in_flight"),
        execute_cost: count(&mut v, pairs, "execute_cost").unwrap_or(1),
        reconcile_cost: count(&mut v, pairs, "reconcile_cost").unwrap_or(1),
        per_key: Default::default(),
    };
    let queues = value(pairs, "queues")
        .unwrap_or("")
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|q| !q.is_empty())
        .map(str::to_owned)
        .collect();
    if v.is_empty() {
        Ok((budget, queues))
    } else {
        Err(v)
    }
}

/// The pause form's choice (`pause` = `all` or `sends`).
pub fn pause(pairs: &Pairs) -> Result<Pause, FieldViolation> {
    match value(pairs, "pause") {
        Some("all") => Ok(Pause::All),
        Some("sends") => Ok(Pause::Sends),
        Some(other) => Err(FieldViolation::new(
            "pause",
            format!("{other:?} is not a pause; choose all or sends"),
        )),
        None => Err(FieldViolation::new(
            "pause",
            "choose what to hold: everything, or sends only (reconciles go on)",
        )),
    }
}

/// A query string from pairs, percent-encoded, without empty values.
pub fn query_string(pairs: &[(&str, &str)]) -> String {
    let kept: Vec<_> = pairs.iter().filter(|(_, v)| !v.is_empty()).collect();
    serde_urlencoded::to_string(kept).unwrap_or_default()
}

/// `p` as a form's pairs, for the pages' tests.
#[cfg(test)]
pub(crate) fn pairs_of(p: &[(&str, &str)]) -> Pairs {
    p.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(&str, &str)]) -> Pairs {
        pairs_of(p)
    }

    #[test]
    fn a_jobs_filter_reads_every_field() {
        let (f, bad) = jobs_filter(
            &pairs(&[
                ("queue", " refunds "),
                ("state", "manual-review"),
                ("state", "READY"),
                ("state", "any"),
                ("older_than", "1h 30m"),
                ("operation_key", "refund-pay_1"),
                ("after", "40"),
            ]),
            JOBS_PAGE,
        );
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(f.queue.as_deref(), Some("refunds"));
        assert_eq!(f.states, [JobState::ManualReview, JobState::Ready]);
        assert_eq!(f.min_age, Some(Duration::from_secs(5400)));
        assert_eq!(f.operation_key.as_deref(), Some("refund-pay_1"));
        assert_eq!((f.after_id, f.limit), (40, JOBS_PAGE));
    }

    #[test]
    fn a_bad_filter_names_each_bad_field() {
        let (_, bad) = jobs_filter(
            &pairs(&[
                ("state", "stuck"),
                ("older_than", "5 parsecs"),
                ("after", "x"),
            ]),
            JOBS_PAGE,
        );
        let fields: Vec<_> = bad.iter().map(|b| b.field.as_str()).collect();
        assert_eq!(fields, ["state", "older_than", "after"]);
        assert!(bad[0].description.contains("manual_review"));
        assert!(bad[1].description.contains("not a duration"));
    }

    #[test]
    fn a_resolution_form_becomes_the_request() {
        let (req, authorize) = resolve_request(
            7,
            "alice",
            &pairs(&[
                ("attempt", "3"),
                ("resolution", "succeeded"),
                ("provider_reference", "re_1"),
                ("reason", "in the dashboard"),
            ]),
        )
        .unwrap();
        assert_eq!((req.job_id, req.attempt), (7, 3));
        assert_eq!(req.operator, "alice");
        assert_eq!(req.reason, "in the dashboard");
        assert!(!authorize);
        assert_eq!(
            req.resolution,
            Resolution::Succeeded {
                provider_reference: "re_1".into(),
                result: None
            }
        );
        let (req, authorize) = resolve_request(
            7,
            "bob",
            &pairs(&[
                ("attempt", "3"),
                ("resolution", "retry_execute"),
                ("delay", "10m"),
                ("authorize_resend", "on"),
            ]),
        )
        .unwrap();
        assert!(authorize);
        assert_eq!(
            req.resolution,
            Resolution::RetryExecute {
                delay: Duration::from_secs(600)
            }
        );
    }

    #[test]
    fn a_resolution_form_without_attempt_or_choice_is_refused() {
        let bad = resolve_request(7, "alice", &pairs(&[("delay", "soon")])).unwrap_err();
        let fields: Vec<_> = bad.iter().map(|b| b.field.as_str()).collect();
        assert_eq!(fields, ["attempt", "resolution"]);
        let bad = resolve_request(
            7,
            "alice",
            &pairs(&[
                ("attempt", "1"),
                ("resolution", "retry_reconcile"),
                ("delay", "soon"),
            ]),
        )
        .unwrap_err();
        assert_eq!(bad[0].field, "delay");
    }

    #[test]
    fn a_budget_form_becomes_the_budget_and_its_queues() {
        let (b, queues) = budget(&pairs(&[
            ("rate_per_second", "0.5"),
            ("burst", "10"),
            ("max_in_flight", ""),
            ("reconcile_cost", "2"),
            ("queues", "refunds, payouts  chargebacks"),
        ]))
        .unwrap();
        assert_eq!(
            b,
            Budget {
                rate_per_second: 0.5,
                burst: 10,
                max_in_flight: None,
                execute_cost: 1,
                reconcile_cost: 2,
                per_key: Default::default(),
            }
        );
        assert_eq!(queues, ["refunds", "payouts", "chargebacks"]);
        let bad = budget(&pairs(&[
            ("rate_per_second", "fast"),
            ("max_in_flight", "-1"),
        ]))
        .unwrap_err();
        let fields: Vec<_> = bad.iter().map(|b| b.field.as_str()).collect();
        assert_eq!(fields, ["rate_per_second", "burst", "max_in_flight"]);
    }

    #[test]
    fn a_pause_form_names_all_or_sends() {
        assert_eq!(pause(&pairs(&[("pause", "sends")])), Ok(Pause::Sends));
        assert_eq!(pause(&pairs(&[("pause", "all")])), Ok(Pause::All));
        assert_eq!(
            pause(&pairs(&[("pause", "none")])).unwrap_err().field,
            "pause"
        );
        assert_eq!(pause(&pairs(&[])).unwrap_err().field, "pause");
    }

    #[test]
    fn query_strings_are_encoded() {
        assert_eq!(
            query_string(&[("queue", "a b"), ("state", ""), ("operation_key", "k&x=1")]),
            "queue=a+b&operation_key=k%26x%3D1"
        );
    }
}

//! Queues: per queue, jobs by state, the oldest pending and unfinished
//! ages (database clock), takeovers and stale-write rejections over a
//! chosen window, and the recent trend; refreshed live.

use super::{refusal, view};
use crate::forms::{self, query_string, Pairs};
use crate::view::{age, job_link, sparkline, stacked_bar, Nav, Notice};
use crate::{history, Console};
use jobfence_core::workers::{DEFAULT_STALE_AFTER, DEFAULT_WITHIN};
use jobfence_domain::admin::{QueuePending, QueueStats, StateChange};
use jobfence_domain::JobState;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use maud::{html, Markup};
use std::time::Duration;

/// The windows offered in the chooser (any other `?window=` works too).
const WINDOWS: [&str; 5] = ["15m", "1h", "6h", "24h", "7d"];
/// Seconds between two live refreshes.
const REFRESH_SECS: u32 = 5;

fn window_label(w: Duration) -> String {
    humantime::format_duration(w).to_string()
}

fn tile(label: &str, value: Markup, warn: bool) -> Markup {
    html! {
        div class={ "tile" @if warn { " warn" } } {
            div.label { (label) }
            div.value { (value) }
        }
    }
}

fn oldest(pending: &QueuePending, state: JobState) -> Markup {
    let i = QueuePending::STATES
        .iter()
        .position(|s| *s == state)
        .expect("a pending state");
    match pending.oldest[i] {
        Some(o) => html! { (age(o.age)) " " span.small { (job_link(o.job_id)) } },
        None => html! { span.muted { "none" } },
    }
}

fn card(s: &QueueStats, window: Duration, changes: &[StateChange], unattended: bool) -> Markup {
    let total: u64 = s.counts.iter().map(|c| c.1).sum();
    let count = |st: JobState| s.counts.iter().find(|c| c.0 == st).map_or(0, |c| c.1);
    let parked = count(JobState::ManualReview);
    let series = history::series(s, changes);
    let last = |v: &[(f64, f64)]| v.last().map_or(String::new(), |p| format!("{:.0}", p.1));
    let w = window_label(window);
    html! {
        section.card data-queue=(s.queue) {
            div.card-head {
                h2 { a href={ "/jobs?" (query_string(&[("queue", &s.queue)])) } { (s.queue) } }
                span.muted { (total) " jobs" }
                @if parked > 0 {
                    a.button.warn href={ "/review?" (query_string(&[("queue", &s.queue)])) } {
                        (parked) " waiting for an operator →"
                    }
                }
            }
            @if unattended {
                div.notice.warn.no-worker {
                    strong { (count(JobState::Ready)) " ready, and no live worker: " }
                    "no worker called about this queue in the last minute, and none holds a lease on it. "
                    a href="/workers" { "Workers →" }
                }
            }
            @if let Some(h) = &s.held {
                div.notice.warn.held data-hold=(h.kind.as_str()) {
                    strong { (count(JobState::Ready)) " ready held: " }
                    (h.why)
                    @if let (Some(since), Some(by)) = (h.since, &h.by) {
                        " (by " (by) " since " (since.format("%Y-%m-%d %H:%M:%S")) " UTC)"
                    }
                    @if !h.provider.is_empty() {
                        " " a href={ "/providers#provider-" (h.provider) } { "provider " (h.provider) " →" }
                    }
                }
            }
            (stacked_bar(&s.counts))
            ul.legend {
                @for (st, n) in &s.counts {
                    li {
                        span class={ "dot " (st.as_str()) } {}
                        a href={ "/jobs?" (query_string(&[("queue", &s.queue), ("state", st.as_str())])) } {
                            (st.as_str().replace('_', " ")) " " strong { (n) }
                        }
                    }
                }
            }
            div.tiles {
                (tile("Oldest due ready", oldest(&s.pending, JobState::Ready), false))
                (tile("Oldest running", oldest(&s.pending, JobState::Running), false))
                (tile("Oldest parked", oldest(&s.pending, JobState::ManualReview), parked > 0))
                (tile("Oldest unfinished", html! {
                    @match s.pending.unfinished { Some(a) => (age(a)), None => span.muted { "none" } }
                }, false))
                (tile(&format!("Takeovers, last {w}"), html! { (s.takeovers) }, s.takeovers > 0))
                (tile(&format!("Stale writes refused, last {w}"), html! { (s.stale_write_rejections) }, s.stale_write_rejections > 0))
            }
            (due_keys(s))
            div.trends {
                div.trend { span.label { "Backlog (ready + running) " strong { (last(&series.backlog)) } } (sparkline(&series.backlog, 220.0, 36.0, "backlog")) }
                div.trend { span.label { "Parked " strong { (last(&series.parked)) } } (sparkline(&series.parked, 220.0, 36.0, "parked")) }
                div.trend { span.label { "Finished per minute " strong { (last(&series.finished_per_min)) } } (sparkline(&series.finished_per_min, 220.0, 36.0, "done")) }
            }
        }
    }
}

/// Due jobs by fairness key (docs/design.md rule 18), when the queue has
/// more than one key: the keys with the most, and the rest summed.
fn due_keys(s: &QueueStats) -> Markup {
    let d = &s.due_keys;
    if d.top.len() < 2 && d.others.is_none() {
        return html! {};
    }
    html! {
        div.due-keys {
            span.label { "Due by fairness key (round-robin) " }
            ul.legend {
                @for k in &d.top {
                    li {
                        @match &k.fairness_key {
                            Some(key) => code { (key) },
                            None => span.muted { "no key" },
                        }
                        " " strong { (k.due) } " " span.small.muted { "oldest " (age(k.oldest_due)) }
                    }
                }
                @if let Some(o) = &d.others {
                    li {
                        (o.keys) " other keys " strong { (o.due) } " "
                        span.small.muted { "oldest " (age(o.oldest_due)) }
                    }
                }
            }
        }
    }
}

/// The queues with ready jobs that no live worker is on (see
/// [`super::workers::no_live_worker`]); none when the workers cannot be
/// read (the banner is a hint, never a false alarm).
async fn unattended(console: &Console, stats: &[QueueStats]) -> Vec<String> {
    let ready: Vec<String> = stats
        .iter()
        .filter(|s| s.counts.iter().any(|c| c.0 == JobState::Ready && c.1 > 0))
        .map(|s| s.queue.clone())
        .collect();
    if ready.is_empty() {
        return ready;
    }
    match console
        .coordinator
        .workers(DEFAULT_STALE_AFTER, DEFAULT_WITHIN)
        .await
    {
        Ok(workers) => super::workers::no_live_worker(&workers, &ready)
            .into_iter()
            .map(str::to_owned)
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The live region: every queue's card.
async fn cards(console: &Console, window: Duration) -> Result<Markup, (StatusCode, Notice)> {
    let (stats, window) = console
        .coordinator
        .queue_stats(None, Some(window))
        .await
        .map_err(|e| refusal(&e))?;
    let unattended = unattended(console, &stats).await;
    // The trends are a hint: without the events, the cards still show.
    let changes = console
        .coordinator
        .state_changes(history::WINDOW)
        .await
        .unwrap_or_default();
    Ok(html! {
        @if stats.is_empty() {
            p.empty { "No jobs yet. Enqueue one and it shows up here." }
        }
        @for s in &stats { (card(s, window, &changes, unattended.contains(&s.queue))) }
        p.muted.small {
            "Ages use the database clock. Trends over the last " (age(history::WINDOW))
            ", rebuilt from the stored events at each refresh (the same on every coordinator, "
            "and through restarts). Updated "
            (chrono::Utc::now().format("%H:%M:%S")) " UTC."
        }
    })
}

/// `GET /queues?window=1h`.
pub async fn page(State(console): State<Console>, Query(q): Query<Pairs>) -> Response {
    let (window, mut notices, mut status) = match forms::window(&q) {
        Ok(w) => (w, vec![], StatusCode::OK),
        Err(bad) => (
            forms::DEFAULT_WINDOW,
            vec![super::bad_input(&[bad]).with_lines([format!(
                "showing the last {} instead",
                window_label(forms::DEFAULT_WINDOW)
            )])],
            StatusCode::BAD_REQUEST,
        ),
    };
    let live = match cards(&console, window).await {
        Ok(m) => m,
        Err((s, n)) => {
            notices.push(n);
            status = s;
            html! {}
        }
    };
    let w = window_label(window);
    let body = html! {
        div.page-head {
            h1 { "Queues" }
            form.inline method="get" action="/queues" {
                label for="window" { "Takeovers and stale writes over the last" }
                select #window name="window" {
                    @for opt in WINDOWS {
                        option value=(opt) selected[opt == w] { (opt) }
                    }
                    @if !WINDOWS.contains(&w.as_str()) { option value=(w) selected { (w) } }
                }
                button type="submit" { "Show" }
            }
            span.live-status data-for="queues-live" { "live" }
        }
        div #queues-live data-live={ "/queues/live?" (query_string(&[("window", &w)])) } data-every=(REFRESH_SECS) {
            (live)
        }
    };
    view::respond(
        status,
        view::page("Queues", Nav::Queues, &notices, body),
        [],
    )
}

/// `GET /queues/live?window=1h`: the cards alone, for the live refresh.
pub async fn live(State(console): State<Console>, Query(q): Query<Pairs>) -> Response {
    let window = forms::window(&q).unwrap_or(forms::DEFAULT_WINDOW);
    match cards(&console, window).await {
        Ok(m) => view::respond(StatusCode::OK, m, []),
        Err((s, n)) => view::respond(s, html! { div.notice.error { (n.title) } }, []),
    }
}

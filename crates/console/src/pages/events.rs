//! Events: the outbox feed, newest first, filterable by queue, followed
//! live. The page reads the same cursor-paged feed as ListEvents; the
//! browser then asks for the events after its cursor every couple of
//! seconds, which is what WatchEvents does inside the server, so every
//! committed event shows up once and in order.
//!
//! A coordinator over several databases (`--shards`) has one feed per
//! database, each with its own cursor: the page holds one cursor per
//! database (`from` and `after` are lists, comma-separated), reads every
//! feed, and shows their events together, by time.

use super::{refusal, view};
use crate::forms::{self, query_string, Pairs};
use crate::timeline::tell;
use crate::view::{job_link, when, Nav, Notice};
use crate::Console;
use jobfence_domain::feed::FeedEvent;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{html, Markup};

/// Event ids the page starts before the newest one, and the most events
/// one read returns.
const PAGE: u64 = 200;
/// Milliseconds between two live reads.
const POLL_MS: u32 = 2000;

fn rows(events: &[FeedEvent]) -> Markup {
    html! {
        @for e in events.iter().rev() {
            @let told = tell(e);
            tr class=(told.tone.class()) data-event-id=(e.id) {
                td.num { (e.id) }
                td { (when(e.created_at)) }
                td { (job_link(e.job_id)) }
                td { (e.queue) }
                td.num { (e.attempt) }
                td { strong { (told.title) } div.small { (told.text) } }
            }
        }
    }
}

/// The events of every database's feed after `cursors` (one per
/// database), together by time, oldest first, and each feed's next
/// cursor.
async fn read_feeds(
    console: &Console,
    cursors: &[u64],
    queue: Option<&str>,
) -> Result<(Vec<FeedEvent>, Vec<u64>), jobfence_domain::CoordinatorError> {
    let mut events = Vec::new();
    let mut next = Vec::with_capacity(cursors.len());
    for &cursor in cursors {
        let page = console
            .coordinator
            .list_events(cursor, PAGE as u32, queue)
            .await?;
        next.push(page.next_after);
        events.extend(page.events);
    }
    events.sort_by_key(|e| (e.created_at, e.id));
    Ok((events, next))
}

fn joined(cursors: &[u64]) -> String {
    cursors
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// `GET /events?queue=&from=`: the latest events, or those after `from`
/// (one cursor per database).
pub async fn page(State(console): State<Console>, Query(q): Query<Pairs>) -> Response {
    let queue = forms::value(&q, "queue").map(str::to_owned);
    let q_owned = queue.clone().unwrap_or_default();
    let mut notices: Vec<Notice> = vec![];
    let mut status = StatusCode::OK;
    let from = match forms::cursors(&q, "from") {
        Ok(f) => f,
        Err(bad) => {
            notices.push(super::bad_input(&[bad]));
            status = StatusCode::BAD_REQUEST;
            None
        }
    };
    let live = from.is_none();
    let start = match from {
        Some(f) => Ok(f),
        None => console.coordinator.latest_event_cursors(PAGE).await,
    };
    let page = match start {
        Ok(start) => read_feeds(&console, &start, queue.as_deref())
            .await
            .map(|p| (start, p)),
        Err(e) => Err(e),
    };
    let table = match page {
        Ok((start, (events, next_after))) => {
            let starts = console.coordinator.feed_starts();
            let earlier: Vec<u64> = start
                .iter()
                .zip(starts.iter().chain(std::iter::repeat(&0)))
                .map(|(c, s)| c.saturating_sub(PAGE).max(*s))
                .collect();
            let has_earlier = start
                .iter()
                .zip(starts.iter().chain(std::iter::repeat(&0)))
                .any(|(c, s)| c > s);
            let earlier = joined(&earlier);
            html! {
                table.events
                    data-feed=[live.then(|| format!("/events/live?{}", query_string(&[("queue", &q_owned)])))]
                    data-after=(joined(&next_after)) data-every-ms=(POLL_MS) {
                    thead { tr { th.num { "Event" } th { "When" } th { "Job" } th { "Queue" } th.num { "Attempt" } th { "What happened" } } }
                    tbody { (rows(&events)) }
                }
                @if events.is_empty() { p.empty { "No events here yet" @if live { "; new ones appear as they happen" } "." } }
                nav.pager {
                    @if has_earlier {
                        a href={ "/events?" (query_string(&[("queue", &q_owned), ("from", &earlier)])) } { "← earlier events" }
                    }
                    @if !live { a href={ "/events?" (query_string(&[("queue", &q_owned)])) } { "latest, live →" } }
                }
            }
        }
        Err(e) => {
            let (s, n) = refusal(&e);
            notices.push(n);
            status = s;
            html! {}
        }
    };
    let body = html! {
        div.page-head {
            h1 { "Events" }
            span.muted { "newest first" @if live { ", live" } }
            form.inline method="get" action="/events" {
                label for="queue" { "Queue" }
                input #queue type="text" name="queue" value=(q_owned) placeholder="any";
                button type="submit" { "Filter" }
            }
            @if live { span.live-status data-for="feed" { "live" } }
        }
        (table)
    };
    view::respond(
        status,
        view::page("Events", Nav::Events, &notices, body),
        [],
    )
}

/// `GET /events/live?queue=&after=C[,C…]`: `{"after": cursors, "rows":
/// html}`, the rows of the events after each database's cursor, newest
/// first.
pub async fn live(State(console): State<Console>, Query(q): Query<Pairs>) -> Response {
    let after = match forms::cursors(&q, "after") {
        Ok(Some(a)) => a,
        Ok(None) => console.coordinator.feed_starts(),
        Err(bad) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("{}: {}", bad.field, bad.description),
            )
                .into_response();
        }
    };
    let queue = forms::value(&q, "queue");
    match read_feeds(&console, &after, queue).await {
        Ok((events, next)) => axum::Json(serde_json::json!({
            "after": joined(&next),
            "rows": rows(&events).into_string(),
        }))
        .into_response(),
        Err(e) => {
            let (s, n) = refusal(&e);
            (s, n.title).into_response()
        }
    }
}

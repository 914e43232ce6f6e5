//! The page shell and the small pieces every page uses: notices, state
//! badges, ages and times, charts, the timeline.
//!
//! Markup is built with maud, which escapes every value spliced into it;
//! the only unescaped string in the console is the doctype. So nothing a
//! payload, an observation body or an error message holds can become
//! markup, and the Content-Security-Policy (see `super::router`) forbids
//! any script but the console's own file on top.

use super::timeline;
use jobfence_domain::feed::FeedEvent;
use jobfence_domain::EventKind;
use jobfence_domain::{DbTime, JobState};

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::{html, Markup, DOCTYPE};
use std::time::Duration;

/// The page a link in the top bar leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nav {
    /// `/queues`.
    Queues,
    /// `/jobs` and a job's page.
    Jobs,
    /// `/review`.
    Review,
    /// `/providers`.
    Providers,
    /// `/events`.
    Events,
    /// `/settlement`.
    Settlement,
    /// `/workers`.
    Workers,
    /// A page of none of them (not found).
    None,
}

/// How a notice is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Done as asked.
    Ok,
    /// Not done, and why (someone else was first, the job moved on).
    Warn,
    /// The input was wrong or the database failed.
    Error,
}

/// A message at the top of a page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// Its colour.
    pub level: Level,
    /// One sentence.
    pub title: String,
    /// Details, one per line (e.g. each bad field).
    pub lines: Vec<String>,
}

impl Notice {
    /// A notice without detail lines.
    pub fn new(level: Level, title: impl Into<String>) -> Notice {
        Notice {
            level,
            title: title.into(),
            lines: Vec::new(),
        }
    }

    /// Adds detail lines.
    pub fn with_lines(mut self, lines: impl IntoIterator<Item = String>) -> Notice {
        self.lines.extend(lines);
        self
    }
}

fn notice(n: &Notice) -> Markup {
    let class = match n.level {
        Level::Ok => "notice ok",
        Level::Warn => "notice warn",
        Level::Error => "notice error",
    };
    html! {
        div class=(class) role="alert" {
            strong { (n.title) }
            @if !n.lines.is_empty() {
                ul { @for l in &n.lines { li { (l) } } }
            }
        }
    }
}

tokio::task_local! {
    /// The operator the console acts as during this request (set by the
    /// console's credential check), for the top bar.
    pub static ACTING_AS: String;
}

fn acting_as() -> Option<String> {
    ACTING_AS.try_with(Clone::clone).ok()
}

/// The whole page around `body`.
pub fn page(title: &str, nav: Nav, notices: &[Notice], body: Markup) -> Markup {
    let link = |to: Nav, href: &str, label: &str| {
        html! { a href=(href) class=[(nav == to).then_some("active")] { (label) } }
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · jobfence console" }
                link rel="stylesheet" href="/static/console.css";
                script src="/static/console.js" defer {}
            }
            body {
                header.top {
                    a.brand href="/queues" { "jobfence" }
                    nav {
                        (link(Nav::Queues, "/queues", "Queues"))
                        (link(Nav::Workers, "/workers", "Workers"))
                        (link(Nav::Jobs, "/jobs", "Jobs"))
                        (link(Nav::Review, "/review", "Manual review"))
                        (link(Nav::Providers, "/providers", "Providers"))
                        (link(Nav::Events, "/events", "Events"))
                        (link(Nav::Settlement, "/settlement", "Settlement"))
                    }
                    @match acting_as() {
                        Some(name) => span.operator title="The console acts with this operator's credential, checked on every request; it serves loopback addresses only." {
                            "Acting as " strong { (name) }
                        },
                        None => span.noauth title="The coordinator runs without authentication (--insecure); the console serves loopback addresses only." {
                            "No authentication: names are typed, not verified"
                        },
                    }
                }
                main {
                    @for n in notices { (notice(n)) }
                    (body)
                }
            }
        }
    }
}

/// An HTML answer with `status`, adding each `Set-Cookie` given.
pub fn respond(
    status: StatusCode,
    markup: Markup,
    cookies: impl IntoIterator<Item = Option<HeaderValue>>,
) -> Response {
    let mut response = (status, markup).into_response();
    for c in cookies.into_iter().flatten() {
        response.headers_mut().append(header::SET_COOKIE, c);
    }
    response
}

/// A job state as a coloured badge.
pub fn state(s: JobState) -> Markup {
    html! { span class={ "state " (s.as_str()) } { (s.as_str().replace('_', " ")) } }
}

/// A duration for a person: `42s`, `12m 5s`, `3h 12m`, `2d 4h`.
pub fn age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// How long ago `t` was, by this server's clock (for display only; every
/// decision uses the database's clock).
pub fn ago(t: DbTime) -> String {
    let now = chrono::Utc::now().naive_utc();
    age((now - t).to_std().unwrap_or_default())
}

/// A database time (UTC), to the millisecond.
pub fn time(t: DbTime) -> String {
    t.format("%Y-%m-%d %H:%M:%S%.3f").to_string()
}

/// A time with its age on hover.
pub fn when(t: DbTime) -> Markup {
    html! { time datetime=(t.format("%Y-%m-%dT%H:%M:%S%.6fZ")) title={ (ago(t)) " ago" } { (time(t)) } }
}

/// A line chart of `(seconds ago, value)` points, `w`×`h` pixels.
pub fn sparkline(points: &[(f64, f64)], w: f64, h: f64, class: &str) -> Markup {
    if points.len() < 2 {
        return html! { span.muted.small { "collecting…" } };
    }
    let span = points.iter().map(|p| p.0).fold(0.0_f64, f64::max).max(1.0);
    let top = points.iter().map(|p| p.1).fold(0.0_f64, f64::max).max(1.0);
    let coords: Vec<String> = points
        .iter()
        .map(|(ago, v)| {
            let x = (span - ago) / span * (w - 2.0) + 1.0;
            let y = h - 1.0 - v / top * (h - 2.0);
            format!("{x:.1},{y:.1}")
        })
        .collect();
    html! {
        svg class={ "spark " (class) } width=(w) height=(h) viewBox={ "0 0 " (w) " " (h) } role="img" {
            polyline points=(coords.join(" ")) {}
        }
    }
}

/// A horizontal bar of `parts` (state, count), each in its state's colour.
pub fn stacked_bar(parts: &[(JobState, u64)]) -> Markup {
    let total: u64 = parts.iter().map(|p| p.1).sum();
    let mut x = 0.0;
    let segments: Vec<(JobState, u64, f64, f64)> = parts
        .iter()
        .map(|(s, n)| {
            let w = if total == 0 {
                0.0
            } else {
                *n as f64 / total as f64 * 1000.0
            };
            x += w;
            (*s, *n, x - w, w)
        })
        .collect();
    html! {
        svg.bar viewBox="0 0 1000 14" preserveAspectRatio="none" role="img" {
            @for (s, n, x, w) in segments {
                rect class={ "fill " (s.as_str()) } x=(format!("{x:.1}")) y="0" width=(format!("{w:.1}")) height="14" {
                    title { (s.as_str()) ": " (n) }
                }
            }
        }
    }
}

/// Events of one job, oldest first, as a timeline. Runs of lease renewals
/// by one attempt are folded into one line.
pub fn timeline(events: &[FeedEvent]) -> Markup {
    let mut rows: Vec<(&FeedEvent, usize)> = Vec::new();
    for e in events {
        match rows.last_mut() {
            Some((prev, n))
                if e.event_kind() == Some(EventKind::LeaseRenewed)
                    && prev.event_kind() == Some(EventKind::LeaseRenewed)
                    && prev.attempt == e.attempt =>
            {
                *n += 1
            }
            _ => rows.push((e, 1)),
        }
    }
    html! {
        ol.timeline {
            @for (e, n) in rows {
                @let told = timeline::tell(e);
                li class=(told.tone.class()) data-kind=(e.kind) {
                    div.when { (when(e.created_at)) }
                    div.what {
                        strong { (told.title) }
                        @if n > 1 { " " span.muted { "×" (n) } }
                        div { (told.text) }
                        @if let Some(d) = &e.detail {
                            details { summary { "event " (e.id) ": " (e.kind) } pre { (d) } }
                        }
                    }
                }
            }
        }
    }
}

/// "once", "2 times".
pub fn times(n: u32) -> String {
    match n {
        1 => "once".to_owned(),
        n => format!("{n} times"),
    }
}

/// A link to a job.
pub fn job_link(id: u64) -> Markup {
    html! { a href={ "/jobs/" (id) } { "#" (id) } }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_a_person_says_them() {
        assert_eq!(age(Duration::from_secs(42)), "42s");
        assert_eq!(age(Duration::from_secs(725)), "12m 5s");
        assert_eq!(age(Duration::from_secs(3 * 3600 + 12 * 60)), "3h 12m");
        assert_eq!(age(Duration::from_secs(2 * 86_400 + 4 * 3600)), "2d 4h");
    }

    #[test]
    fn values_are_escaped_in_every_piece() {
        let n = Notice::new(Level::Error, "<script>alert(1)</script>")
            .with_lines(["<b>x</b>".to_owned()]);
        let html = page("<t>", Nav::None, &[n], html! { p { "<i>" } }).into_string();
        assert!(!html.contains("<script>alert"));
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains("&lt;b&gt;x&lt;/b&gt;"));
        assert!(html.contains("&lt;t&gt; · jobfence console"));
    }

    #[test]
    fn a_sparkline_needs_two_points() {
        assert!(sparkline(&[(0.0, 1.0)], 100.0, 20.0, "x")
            .into_string()
            .contains("collecting"));
        let svg = sparkline(&[(10.0, 0.0), (0.0, 4.0)], 100.0, 20.0, "x").into_string();
        assert!(svg.contains(r#"points="1.0,19.0 99.0,1.0""#), "{svg}");
    }
}

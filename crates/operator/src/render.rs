//! What every command prints with: aligned tables, JSON, and the API's
//! states, times and spans as an operator reads them. Each command's own
//! tables and JSON are in its module.

use jobfence_api::v1::{self as proto, JobState};
use serde_json::Value;
use std::io::Write;

/// Plain left-aligned columns, two spaces apart.
pub(crate) fn table(
    out: &mut dyn Write,
    headers: &[&str],
    rows: &[Vec<String>],
) -> std::io::Result<()> {
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

/// A job state as the tables print it (`manual_review`); empty when unset.
pub(crate) fn state_name(raw: i32) -> String {
    match JobState::try_from(raw) {
        Ok(JobState::Unspecified) | Err(_) => String::new(),
        Ok(s) => s
            .as_str_name()
            .trim_start_matches("JOB_STATE_")
            .to_lowercase(),
    }
}

/// A next action as the tables print it (`execute`, `reconcile`).
pub(crate) fn action_name(raw: i32) -> String {
    proto::NextAction::try_from(raw)
        .map(|a| {
            a.as_str_name()
                .trim_start_matches("NEXT_ACTION_")
                .to_lowercase()
        })
        .unwrap_or_default()
}

/// An enum value's proto name without its prefix, in lower case.
pub(crate) fn enum_name(raw: &str, prefix: &str) -> String {
    raw.trim_start_matches(prefix).to_lowercase()
}

/// A timestamp in UTC to the millisecond; empty when unset.
pub(crate) fn time(t: &Option<prost_types::Timestamp>) -> String {
    t.as_ref()
        .and_then(|t| chrono::DateTime::from_timestamp(t.seconds, t.nanos.max(0) as u32))
        .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_default()
}

/// Whole seconds of a duration, `None` when unset (JSON's `null`).
pub(crate) fn secs(d: &Option<prost_types::Duration>) -> Option<i64> {
    d.as_ref().map(|d| d.seconds)
}

/// Whole seconds as `1h02m03s`; empty when unset.
pub(crate) fn age(d: &Option<prost_types::Duration>) -> String {
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

/// `v`, pretty-printed, on its own lines.
pub(crate) fn print_json(out: &mut dyn Write, v: &Value) -> anyhow::Result<()> {
    writeln!(out, "{}", serde_json::to_string_pretty(v)?)?;
    Ok(())
}

/// A field of a JSON object as a table cell (a string without quotes).
pub(crate) fn str_of(v: &Value, key: &str) -> String {
    match &v[key] {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// A span of time as an operator writes it: `24h`, `1h30m`, `45s`,
/// `250ms`; empty when unset.
pub(crate) fn span(d: &Option<prost_types::Duration>) -> String {
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

/// A span in (fractional) seconds, `None` when unset.
pub(crate) fn span_seconds(d: &Option<prost_types::Duration>) -> Option<f64> {
    d.as_ref()
        .map(|d| d.seconds as f64 + f64::from(d.nanos) / 1e9)
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

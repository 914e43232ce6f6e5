//! Values written into SQL text, for the few statements that travel
//! together in one round trip (several statements in one text query cannot
//! use placeholders). Only values whose every byte this module controls
//! are written: numbers in decimal, timestamps from their digits, and every
//! string as a hex literal (`_utf8mb4 X'…'`), which no byte of the string
//! can break out of, whatever the server's SQL mode.

use jobfence_domain::{CoordinatorError, DbTime};
use std::fmt::Write;

/// A value as SQL text.
pub(crate) trait Literal {
    fn write_sql(&self, out: &mut String);
}

impl Literal for u64 {
    fn write_sql(&self, out: &mut String) {
        let _ = write!(out, "{self}");
    }
}

impl Literal for u32 {
    fn write_sql(&self, out: &mut String) {
        let _ = write!(out, "{self}");
    }
}

impl Literal for str {
    fn write_sql(&self, out: &mut String) {
        out.push_str("_utf8mb4 X'");
        push_hex(out, self.as_bytes());
        out.push('\'');
    }
}

impl Literal for [u8] {
    fn write_sql(&self, out: &mut String) {
        out.push_str("X'");
        push_hex(out, self);
        out.push('\'');
    }
}

impl Literal for DbTime {
    fn write_sql(&self, out: &mut String) {
        out.push('\'');
        push_time(out, self);
        out.push('\'');
    }
}

/// `t` as a `DATETIME(6)` reads it, `YYYY-MM-DD HH:MM:SS.ffffff`, written
/// field by field: `format` with a pattern parses the pattern again at
/// every call, which showed in the coordinator's profile (about 1 % of
/// its CPU at 64 workers: every event's and image's timestamps go
/// through here).
pub(crate) fn push_time(out: &mut String, t: &DbTime) {
    use chrono::{Datelike, Timelike};
    let _ = write!(
        out,
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:06}",
        t.year(),
        t.month(),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.nanosecond() / 1_000 % 1_000_000
    );
}

impl<T: Literal + ?Sized> Literal for Option<&T> {
    fn write_sql(&self, out: &mut String) {
        match self {
            Some(v) => v.write_sql(out),
            None => out.push_str("NULL"),
        }
    }
}

impl<T: Literal + ?Sized> Literal for &T {
    fn write_sql(&self, out: &mut String) {
        (**self).write_sql(out)
    }
}

fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    out.reserve(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0xf)] as char);
    }
}

/// `sql` without its whole-line `--` comments: the server lexes every
/// byte of a text statement on every call (a prepared statement only
/// once), and the comments of `queries/` are most of their bytes.
pub(crate) fn bare(sql: &str) -> String {
    sql.lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A tuple `(a, b, …)` of literals.
pub(crate) fn tuple(out: &mut String, values: &[&dyn Literal]) {
    out.push('(');
    for (i, v) in values.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        v.write_sql(out);
    }
    out.push(')');
}

/// A queue name as a quoted literal. Queue names are validated to
/// `[A-Za-z0-9._-]` before they reach the store; anything else is refused
/// here too rather than written into SQL.
pub(crate) fn queue(name: &str) -> Result<String, CoordinatorError> {
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(CoordinatorError::invalid(
            "queue",
            "may contain only A-Z, a-z, 0-9, '.', '_' and '-'",
        ));
    }
    Ok(format!("'{name}'"))
}

/// A provider name as a quoted literal (validated like a queue name).
pub(crate) fn provider(name: &str) -> Result<String, CoordinatorError> {
    queue(name).map_err(|_| {
        CoordinatorError::invalid(
            "provider",
            "may contain only A-Z, a-z, 0-9, '.', '_' and '-'",
        )
    })
}

/// A DB timestamp as a literal.
pub(crate) fn time(t: DbTime) -> String {
    let mut s = String::new();
    t.write_sql(&mut s);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sql(v: &dyn Literal) -> String {
        let mut s = String::new();
        v.write_sql(&mut s);
        s
    }

    #[test]
    fn strings_are_hex_so_no_byte_can_end_the_literal() {
        assert_eq!(
            sql(&"a'; DROP TABLE jobs; --"),
            "_utf8mb4 X'61273b2044524f50205441424c45206a6f62733b202d2d'"
        );
        assert_eq!(sql(&"\\'"), "_utf8mb4 X'5c27'");
        assert_eq!(sql(&None::<&str>), "NULL");
        assert_eq!(sql(&Some("é")), "_utf8mb4 X'c3a9'");
        assert_eq!(sql(&&[0u8, 255][..]), "X'00ff'");
        assert_eq!(sql(&42u64), "42");
        let t =
            DbTime::parse_from_str("2026-11-30 20:31:21.000042", "%Y-%m-%d %H:%M:%S%.f").unwrap();
        assert_eq!(sql(&t), "'2026-11-30 20:31:21.000042'");
        // Field by field, as the pattern wrote it: padded, six digits.
        for text in ["0999-01-02 03:04:05.000000", "2026-12-31 23:59:59.999999"] {
            let t = DbTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f").unwrap();
            assert_eq!(sql(&t), format!("'{}'", t.format("%Y-%m-%d %H:%M:%S%.6f")));
            assert_eq!(sql(&t), format!("'{text}'"));
        }
    }

    #[test]
    fn bare_sql_keeps_every_line_but_whole_line_comments() {
        let sql = "-- why\nSELECT 1 -- kept\n  -- indented\nFROM t\n";
        assert_eq!(bare(sql), "SELECT 1 -- kept\nFROM t");
    }

    #[test]
    fn only_valid_queue_names_become_literals() {
        assert_eq!(queue("refunds.eu-1_a").unwrap(), "'refunds.eu-1_a'");
        for bad in ["", "a'b", "a b", "a\\", "ü"] {
            assert!(queue(bad).is_err(), "{bad:?}");
        }
    }
}

//! A provider's report, line by line: which column holds what (a stored
//! [`Mapping`], or one of the two presets), and one raw line (column name
//! → text, as the file had it) turned into a [`SettlementLine`] or refused
//! with the line number and the field at fault. Nothing here is stored:
//! the store writes only lines that came out whole (docs/design.md rule 15).

use super::{LineStatus, SettlementLine};
use crate::DbTime;
use std::collections::BTreeMap;

/// How a report's amounts are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AmountUnit {
    /// Integers in the currency's minor unit (cents): Stripe's `amount`,
    /// the fake provider's export.
    Minor,
    /// Decimals in the major unit (`12.34`, `1,234.56`), converted with the
    /// currency's exponent (JPY has none), never through a float; a sign
    /// is dropped (a report may write a refund as negative).
    Major,
}

impl AmountUnit {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            AmountUnit::Minor => "minor",
            AmountUnit::Major => "major",
        }
    }
}

impl_str_enum!(
    AmountUnit,
    "amount unit",
    [AmountUnit::Minor, AmountUnit::Major]
);

/// How a report writes its times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TimeFormat {
    /// Seconds since the Unix epoch (Stripe's `created`).
    UnixSeconds,
    /// RFC 3339 (`2026-12-01T20:57:31Z`), or `YYYY-MM-DD HH:MM:SS` in UTC.
    Rfc3339,
}

impl TimeFormat {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TimeFormat::UnixSeconds => "unix",
            TimeFormat::Rfc3339 => "rfc3339",
        }
    }
}

impl_str_enum!(
    TimeFormat,
    "time format",
    [TimeFormat::UnixSeconds, TimeFormat::Rfc3339]
);

/// Which column of a provider's report holds each field jobfence reads,
/// stored per provider. Nested JSON fields are named with dots
/// (`metadata.operation_key`): the reader flattens objects that way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// The provider's id of the refund (`re_…`): one line per refund; a
    /// line seen again with the same id is the same refund.
    pub provider_reference: String,
    /// The merchant reference jobfence sent: the operation key.
    pub operation_key: String,
    /// The refund's amount.
    pub amount: String,
    /// How the amount is written.
    pub amount_unit: AmountUnit,
    /// Its currency (three letters, any case).
    pub currency: String,
    /// Its status (see [`LineStatus::parse`]).
    pub status: String,
    /// When the provider made it.
    pub created: String,
    /// How that time is written.
    pub created_format: TimeFormat,
}

/// The presets a provider can be given by name (`--preset`).
pub const PRESETS: [&str; 2] = ["fake", "stripe"];

impl Mapping {
    /// The fake provider's export (docs/fake-provider.md, "Settlement
    /// report"): CSV with the columns `id, merchant_reference, amount,
    /// currency, status, created` (amount in minor units, created in Unix
    /// seconds).
    pub fn fake() -> Mapping {
        Mapping {
            provider_reference: "id".into(),
            operation_key: "merchant_reference".into(),
            amount: "amount".into(),
            amount_unit: AmountUnit::Minor,
            currency: "currency".into(),
            status: "status".into(),
            created: "created".into(),
            created_format: TimeFormat::UnixSeconds,
        }
    }

    /// Stripe's Refund objects, one JSON object per line (what listing
    /// refunds prints): `id`, `metadata.operation_key` (the key jobfence
    /// puts in the refund's metadata), `amount` (minor units), `currency`
    /// (lowercase), `status`, `created` (Unix seconds). A line without the
    /// metadata key is matched by its `id` against the provider reference
    /// recorded on the job.
    pub fn stripe() -> Mapping {
        Mapping {
            provider_reference: "id".into(),
            operation_key: "metadata.operation_key".into(),
            amount: "amount".into(),
            amount_unit: AmountUnit::Minor,
            currency: "currency".into(),
            status: "status".into(),
            created: "created".into(),
            created_format: TimeFormat::UnixSeconds,
        }
    }

    /// A preset by name ([`PRESETS`]).
    pub fn preset(name: &str) -> Option<Mapping> {
        match name {
            "fake" => Some(Mapping::fake()),
            "stripe" => Some(Mapping::stripe()),
            _ => None,
        }
    }

    /// The mapping's columns, named as the fields of a stored mapping.
    pub fn columns(&self) -> [(&'static str, &str); 6] {
        [
            ("provider_reference", &self.provider_reference),
            ("operation_key", &self.operation_key),
            ("amount", &self.amount),
            ("currency", &self.currency),
            ("status", &self.status),
            ("created", &self.created),
        ]
    }
}

/// One line of a report as read: its line number in the file (1 is the
/// first line, a CSV header included) and its columns.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RawLine {
    pub line: u64,
    pub fields: BTreeMap<String, String>,
    /// The names the line gives no single value for, with why, as the
    /// reader found them (a JSON array, an object, a name given twice);
    /// none of them is in `fields`. A line is refused when a column the
    /// mapping reads is among them: never read with one value picked.
    pub unreadable: BTreeMap<String, String>,
}

/// Why a line was refused; nothing of it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineRefusal {
    /// Its line number in the file.
    pub line: u64,
    /// The mapping's field at fault (`amount`, `currency`, …).
    pub field: &'static str,
    /// What is wrong, with the value as read.
    pub why: String,
    /// The line has no such column at all (not merely an empty value).
    pub column_missing: bool,
}

impl std::fmt::Display for LineRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}: {}", self.line, self.field, self.why)
    }
}

impl Mapping {
    /// Reads one line. The operation key may be missing or empty (a refund
    /// made by hand, or a Stripe refund without the metadata key): the
    /// line is then matched by its provider reference only.
    pub fn read(&self, raw: &RawLine) -> Result<SettlementLine, LineRefusal> {
        let refuse = |field: &'static str, why: String| LineRefusal {
            line: raw.line,
            field,
            why,
            column_missing: false,
        };
        let get = |field: &'static str, column: &str| -> Result<String, LineRefusal> {
            match raw.fields.get(column).map(|v| v.trim()) {
                Some(v) if !v.is_empty() => Ok(v.to_owned()),
                Some(_) => Err(refuse(field, format!("column {column:?} is empty"))),
                None => Err(LineRefusal {
                    column_missing: true,
                    ..refuse(field, format!("the line has no column {column:?}"))
                }),
            }
        };
        for (field, column) in self.columns() {
            if let Some(why) = raw.unreadable.get(column) {
                return Err(refuse(field, format!("column {column:?} {}", bounded(why))));
            }
        }
        let provider_reference = get("provider_reference", &self.provider_reference)?;
        if provider_reference.len() > 255 {
            return Err(refuse("provider_reference", "longer than 255 bytes".into()));
        }
        let operation_key = raw
            .fields
            .get(&self.operation_key)
            .map(|k| k.trim().to_owned())
            .filter(|k| !k.is_empty());
        if operation_key.as_ref().is_some_and(|k| k.len() > 255) {
            return Err(refuse("operation_key", "longer than 255 bytes".into()));
        }
        let currency =
            currency(&get("currency", &self.currency)?).map_err(|why| refuse("currency", why))?;
        let amount_text = get("amount", &self.amount)?;
        let amount_minor = amount(&amount_text, self.amount_unit, &currency)
            .map_err(|why| refuse("amount", why))?;
        let status_text = get("status", &self.status)?;
        let status = LineStatus::parse(&status_text)
            .ok_or_else(|| refuse("status", format!("{status_text:?} is not a refund status")))?;
        let created_at = time(&get("created", &self.created)?, self.created_format)
            .and_then(within_reason)
            .map_err(|why| refuse("created", why))?;
        Ok(SettlementLine {
            provider_reference,
            operation_key,
            amount_minor,
            currency,
            status,
            created_at,
        })
    }
}

/// At most 200 bytes of a reader's reason (it came with the line).
fn bounded(why: &str) -> &str {
    let mut end = why.len().min(200);
    while !why.is_char_boundary(end) {
        end -= 1;
    }
    &why[..end]
}

/// Three ASCII letters, upper-cased (Stripe writes `usd`).
fn currency(text: &str) -> Result<String, String> {
    if text.len() == 3 && text.bytes().all(|b| b.is_ascii_alphabetic()) {
        Ok(text.to_ascii_uppercase())
    } else {
        Err(format!("{text:?} is not a three-letter currency code"))
    }
}

/// Digits after the point of `currency`'s minor unit (ISO 4217).
pub fn exponent(currency: &str) -> u32 {
    match currency {
        "BIF" | "CLP" | "DJF" | "GNF" | "ISK" | "JPY" | "KMF" | "KRW" | "PYG" | "RWF" | "UGX"
        | "UYI" | "VND" | "VUV" | "XAF" | "XOF" | "XPF" => 0,
        "BHD" | "IQD" | "JOD" | "KWD" | "LYD" | "OMR" | "TND" => 3,
        _ => 2,
    }
}

/// An amount in minor units, above zero.
fn amount(text: &str, unit: AmountUnit, currency: &str) -> Result<i64, String> {
    let bad = || format!("{text:?} is not an amount");
    let minor = match unit {
        AmountUnit::Minor => text.parse::<i64>().map_err(|_| bad())?,
        AmountUnit::Major => {
            // One sign at most (a report may write a refund as negative).
            let unsigned = text.strip_prefix(['-', '+']).unwrap_or(text);
            let (whole, frac) = unsigned.split_once('.').unwrap_or((unsigned, ""));
            let whole = grouped_digits(whole).ok_or_else(bad)?;
            let places = exponent(currency) as usize;
            if !frac.bytes().all(|b| b.is_ascii_digit()) || frac.len() > places {
                return Err(bad());
            }
            let scaled = format!("{whole}{frac:0<places$}");
            scaled.parse::<i64>().map_err(|_| bad())?
        }
    };
    if minor <= 0 {
        return Err(format!("{text:?}: a refund's amount must be above zero"));
    }
    Ok(minor)
}

/// The digits of a whole part written with or without thousands
/// separators (`1234`, `1,234`, `12,345,678`); `None` for anything else
/// (`1,2,3`, `12,34`, empty).
fn grouped_digits(whole: &str) -> Option<String> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let mut groups = whole.split(',');
    let first = groups.next()?;
    let grouped = whole.contains(',');
    if !digits(first) || (grouped && first.len() > 3) {
        return None;
    }
    let mut out = first.to_owned();
    for g in groups {
        if g.len() != 3 || !digits(g) {
            return None;
        }
        out.push_str(g);
    }
    Some(out)
}

/// A report's time, as the database stores it (UTC, no zone, whole
/// microseconds: a finer time, such as .NET's seven digits, is cut to the
/// microsecond the column keeps, or the same report imported again would
/// read as changed).
fn time(text: &str, format: TimeFormat) -> Result<DbTime, String> {
    use chrono::SubsecRound;
    let t = match format {
        TimeFormat::UnixSeconds => text
            .parse::<i64>()
            .ok()
            .and_then(|s| chrono::DateTime::from_timestamp(s, 0))
            .map(|t| t.naive_utc())
            .ok_or_else(|| format!("{text:?} is not a time in Unix seconds")),
        TimeFormat::Rfc3339 => chrono::DateTime::parse_from_rfc3339(text)
            .map(|t| t.naive_utc())
            .or_else(|_| DbTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f"))
            .map_err(|_| format!("{text:?} is not an RFC 3339 time")),
    }?;
    Ok(t.trunc_subsecs(6))
}

/// A refund's time between 1970 and the end of 9999 (what the database
/// stores; anything else is a mangled column, not a refund).
fn within_reason(t: DbTime) -> Result<DbTime, String> {
    let first = DbTime::default(); // 1970-01-01 00:00:00
    let last = chrono::NaiveDate::from_ymd_opt(9999, 12, 31)
        .and_then(|d| d.and_hms_opt(23, 59, 59))
        .expect("a valid date");
    if t < first || t > last {
        return Err(format!(
            "{} is outside 1970-01-01 to 9999-12-31",
            t.format("%Y-%m-%d %H:%M:%S")
        ));
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(line: u64, pairs: &[(&str, &str)]) -> RawLine {
        RawLine {
            line,
            fields: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            unreadable: Default::default(),
        }
    }

    fn stripe(amount: &str, currency: &str, status: &str) -> RawLine {
        raw(
            7,
            &[
                ("id", "re_1"),
                ("metadata.operation_key", "refund-1"),
                ("amount", amount),
                ("currency", currency),
                ("status", status),
                ("created", "1692942318"),
            ],
        )
    }

    #[test]
    fn a_stripe_refund_reads_as_a_line_in_minor_units_and_upper_case() {
        let line = Mapping::stripe()
            .read(&stripe("1000", "usd", "succeeded"))
            .unwrap();
        assert_eq!(line.provider_reference, "re_1");
        assert_eq!(line.operation_key.as_deref(), Some("refund-1"));
        assert_eq!((line.amount_minor, line.currency.as_str()), (1000, "USD"));
        assert_eq!(line.status, LineStatus::Succeeded);
        assert_eq!(
            line.created_at,
            DbTime::parse_from_str("2023-08-25 05:45:18", "%Y-%m-%d %H:%M:%S").unwrap()
        );
        let waiting = Mapping::stripe()
            .read(&stripe("1000", "usd", "requires_action"))
            .unwrap();
        assert_eq!(waiting.status, LineStatus::Pending);
    }

    #[test]
    fn bad_fields_are_refused_with_their_line_and_field() {
        let m = Mapping::stripe();
        for (line, field) in [
            (stripe("12a", "usd", "succeeded"), "amount"),
            (stripe("0", "usd", "succeeded"), "amount"),
            (stripe("-5", "usd", "succeeded"), "amount"),
            (stripe("100", "dollars", "succeeded"), "currency"),
            (stripe("100", "usd", "settled-ish"), "status"),
        ] {
            let refused = m.read(&line).unwrap_err();
            assert_eq!((refused.line, refused.field), (7, field), "{refused}");
        }
        let missing = m.read(&raw(3, &[("id", "re_1")])).unwrap_err();
        assert_eq!((missing.line, missing.field), (3, "currency"));
        // What the database could not store is refused here, by field.
        let long_key = "k".repeat(256);
        for (column, value, field) in [
            ("metadata.operation_key", long_key.as_str(), "operation_key"),
            ("created", "-99999999999", "created"),
            ("created", "999999999999", "created"),
        ] {
            let mut line = stripe("100", "usd", "succeeded");
            line.fields.insert(column.into(), value.into());
            let refused = m.read(&line).unwrap_err();
            assert_eq!((refused.line, refused.field), (7, field), "{refused}");
        }
    }

    #[test]
    fn major_amounts_use_the_currencys_exponent_and_accept_separators() {
        let major = |text: &str, cur: &str| amount(text, AmountUnit::Major, cur);
        assert_eq!(major("1,234.56", "USD"), Ok(123_456));
        assert_eq!(major("-12.3", "EUR"), Ok(1230));
        assert_eq!(major("500", "JPY"), Ok(500));
        assert!(major("5.5", "JPY").is_err(), "JPY has no minor unit");
        assert_eq!(major("1.234", "KWD"), Ok(1234));
        assert!(major("1.234", "USD").is_err());
        assert!(major("0.00", "USD").is_err());
        assert_eq!(major("12,345,678.90", "USD"), Ok(1_234_567_890));
        for mangled in [
            "--5", "+-5", "1,2,3", "12,34", "1234,567", ",500", "5,", "", "-",
        ] {
            assert!(
                major(mangled, "USD").is_err(),
                "{mangled:?} was read as an amount"
            );
        }
    }

    /// A column the reader could give no single value for refuses the
    /// line by its field; an unreadable name the mapping does not read is
    /// no matter.
    #[test]
    fn a_column_with_no_single_value_refuses_its_line() {
        let mut line = stripe("100", "usd", "succeeded");
        line.fields.remove("metadata.operation_key");
        line.unreadable.insert(
            "metadata.operation_key".into(),
            "holds a JSON array, not one value".into(),
        );
        line.unreadable
            .insert("tags".into(), "holds a JSON array, not one value".into());
        let refused = Mapping::stripe().read(&line).unwrap_err();
        assert_eq!((refused.line, refused.field), (7, "operation_key"));
        assert_eq!(
            refused.why,
            "column \"metadata.operation_key\" holds a JSON array, not one value"
        );
        assert!(!refused.column_missing);
        line.unreadable.remove("metadata.operation_key");
        assert_eq!(Mapping::stripe().read(&line).unwrap().operation_key, None);
    }

    #[test]
    fn a_missing_operation_key_is_kept_as_none() {
        let mut line = stripe("100", "usd", "succeeded");
        line.fields.remove("metadata.operation_key");
        assert_eq!(Mapping::stripe().read(&line).unwrap().operation_key, None);
    }

    #[test]
    fn a_time_finer_than_a_microsecond_is_cut_to_the_microsecond() {
        let t = time("2026-12-01T10:00:00.1234567Z", TimeFormat::Rfc3339).unwrap();
        assert_eq!(t.and_utc().timestamp_subsec_nanos(), 123_456_000);
        let t = time("2026-12-01 10:00:00.9999999", TimeFormat::Rfc3339).unwrap();
        assert_eq!(t.and_utc().timestamp_subsec_nanos(), 999_999_000);
    }
}

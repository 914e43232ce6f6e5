//! Request validation: the input limits, and a collector of violations.
//! Every violation of a request is collected, so a caller sees all of them
//! at once; nothing is written for a rejected request.

use crate::violation::FieldViolation;
use std::time::Duration;

/// Longest queue name, in bytes ([A-Za-z0-9._-] only).
pub const MAX_QUEUE_BYTES: usize = 128;
/// Longest operation_key, dedup_key, worker_id or provider_reference, in bytes.
pub const MAX_KEY_BYTES: usize = 255;
/// Largest payload, result or observation body, in bytes (64 KiB).
pub const MAX_BODY_BYTES: usize = 65_536;
/// Longest Fail error text, in bytes.
pub const MAX_ERROR_BYTES: usize = 4_096;
/// Longest enqueue delay or retry delay (30 days).
pub const MAX_DELAY: Duration = Duration::from_secs(30 * 24 * 3600);

/// Collects field violations.
#[derive(Debug, Default)]
pub struct Violations(
    /// The violations so far, in the order found.
    pub Vec<FieldViolation>,
);

impl Violations {
    /// Adds a violation of `field`.
    pub fn add(&mut self, field: &str, description: impl Into<String>) {
        self.0.push(FieldViolation::new(field, description));
    }

    /// `Err(InvalidArgument)` if anything was added.
    pub fn finish(self) -> Result<(), crate::CoordinatorError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(crate::CoordinatorError::InvalidArgument(self.0))
        }
    }

    /// An optional string field, by the API's one rule for strings
    /// (docs/api.md, "Strings"): `""` is not given (`None`); a value made
    /// only of whitespace is refused as blank; anything else is taken as
    /// given, untrimmed.
    pub fn optional(&mut self, field: &str, value: String) -> Option<String> {
        (!value.is_empty() && self.not_blank(field, &value)).then_some(value)
    }

    /// An optional field of content stored as sent (a provider's result):
    /// `""` is not given, anything else is kept, whitespace included.
    pub fn content(value: String) -> Option<String> {
        (!value.is_empty()).then_some(value)
    }

    /// A required string field, by the same rule: `""` is refused with
    /// `missing` (what the field must say), a blank value as blank.
    /// Whether it was given.
    pub fn required(&mut self, field: &str, value: &str, missing: &str) -> bool {
        if value.is_empty() {
            self.add(field, missing);
            false
        } else {
            self.not_blank(field, value)
        }
    }

    /// Refuses a value made only of whitespace (`""` is not blank: it is
    /// not given). Whether it was not blank.
    pub fn not_blank(&mut self, field: &str, value: &str) -> bool {
        let blank = !value.is_empty() && value.trim().is_empty();
        if blank {
            self.add(field, "must not be blank (only whitespace)");
        }
        !blank
    }

    /// A queue name: 1 to [`MAX_QUEUE_BYTES`] bytes of `[A-Za-z0-9._-]`.
    pub fn queue(&mut self, field: &str, queue: &str) {
        if !self.required(field, queue, "must not be empty") {
            return;
        }
        if queue.len() > MAX_QUEUE_BYTES {
            self.add(field, format!("must be at most {MAX_QUEUE_BYTES} bytes"));
        } else if !queue
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            self.add(field, "may contain only A-Z, a-z, 0-9, '.', '_' and '-'");
        }
    }

    /// A required key (worker_id, provider_reference, …): 1 to
    /// [`MAX_KEY_BYTES`] bytes.
    pub fn key(&mut self, field: &str, key: &str) {
        if self.required(field, key, "must not be empty") {
            self.max_bytes(field, key, MAX_KEY_BYTES);
        }
    }

    /// A key that a unique index compares: operation_key, dedup_key. The
    /// columns use `utf8mb4_bin`, a PAD SPACE collation on MariaDB and MySQL
    /// alike, so `"k "` equals `"k"` there while a provider's idempotency
    /// key tells them apart: a trailing space is refused, never merged.
    pub fn unique_key(&mut self, field: &str, key: &str) {
        if key.ends_with(' ') && !key.trim().is_empty() {
            self.add(
                field,
                "must not end with a space (the database compares keys ignoring trailing spaces)",
            );
        } else {
            self.key(field, key);
        }
    }

    /// At most `max` bytes.
    pub fn max_bytes(&mut self, field: &str, value: &str, max: usize) {
        if value.len() > max {
            self.add(
                field,
                format!("must be at most {max} bytes (got {})", value.len()),
            );
        }
    }

    /// A job id: ids start at 1.
    pub fn job_id(&mut self, job_id: u64) {
        if job_id == 0 {
            self.add("job_id", "is required (job ids start at 1)");
        }
    }

    /// A presented attempt: attempts start at 1.
    pub fn attempt(&mut self, attempt: u64) {
        if attempt == 0 {
            self.add(
                "attempt",
                "is required: present the attempt your claim or takeover returned",
            );
        }
    }

    /// A delay: at most [`MAX_DELAY`].
    pub fn delay(&mut self, field: &str, delay: Duration) {
        if delay > MAX_DELAY {
            self.add(
                field,
                format!("must be at most {}", humantime::format_duration(MAX_DELAY)),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(check: impl FnOnce(&mut Violations)) -> Vec<(String, String)> {
        let mut v = Violations::default();
        check(&mut v);
        v.0.into_iter().map(|f| (f.field, f.description)).collect()
    }

    #[test]
    fn empty_is_not_given_and_blank_is_refused() {
        let mut v = Violations::default();
        assert_eq!(v.optional("provider", String::new()), None);
        assert_eq!(
            v.optional("provider", " stripe ".into()),
            Some(" stripe ".into())
        );
        assert!(v.0.is_empty());
        let blank = "must not be blank (only whitespace)".to_owned();
        for value in [" ", "\t", " \n "] {
            assert_eq!(
                refused(|v| assert_eq!(v.optional("provider", value.into()), None)),
                [("provider".to_owned(), blank.clone())]
            );
            for check in [Violations::key, Violations::unique_key, Violations::queue] {
                assert_eq!(
                    refused(|v| check(v, "worker_id", value)),
                    [("worker_id".to_owned(), blank.clone())],
                    "{value:?}"
                );
            }
        }
        assert_eq!(
            refused(|v| v.key("worker_id", "")),
            [("worker_id".to_owned(), "must not be empty".to_owned())]
        );
        assert_eq!(
            refused(|v| assert!(!v.required("reason", "", "must say why"))),
            [("reason".to_owned(), "must say why".to_owned())]
        );
    }
}

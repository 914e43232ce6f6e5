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

    /// A queue name: 1 to [`MAX_QUEUE_BYTES`] bytes of `[A-Za-z0-9._-]`.
    pub fn queue(&mut self, field: &str, queue: &str) {
        if queue.is_empty() {
            self.add(field, "must not be empty");
        } else if queue.len() > MAX_QUEUE_BYTES {
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
        if key.is_empty() {
            self.add(field, "must not be empty");
        } else {
            self.max_bytes(field, key, MAX_KEY_BYTES);
        }
    }

    /// A key that a unique index compares: operation_key, dedup_key. The
    /// columns use `utf8mb4_bin`, a PAD SPACE collation on MariaDB and MySQL
    /// alike, so `"k "` equals `"k"` there while a provider's idempotency
    /// key tells them apart: a trailing space is refused, never merged.
    pub fn unique_key(&mut self, field: &str, key: &str) {
        if key.ends_with(' ') {
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

//! One bad field of a request. A module of its own because both the
//! budget rules ([`crate::budget`]) and the error type ([`crate::error`])
//! speak of it, and the error type also names the budget's holdbacks.

/// A field of a request that failed validation, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldViolation {
    /// The field, as the request names it (`items[3].queue`, `lease`).
    pub field: String,
    /// What is wrong with it, in words a caller can act on.
    pub description: String,
}

impl FieldViolation {
    /// A violation of `field`.
    pub fn new(field: impl Into<String>, description: impl Into<String>) -> Self {
        FieldViolation {
            field: field.into(),
            description: description.into(),
        }
    }
}

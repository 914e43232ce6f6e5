//! A coordinator's refusal as the operator reads it: the status code, the
//! ErrorInfo reason and its metadata on one line, then each bad field of a
//! BadRequest on a line of its own, named by the flag that sets it.

use tonic_types::StatusExt;

/// A refusal as one line: code, ErrorInfo reason, message, metadata; then
/// each bad field of a BadRequest on a line of its own.
pub fn describe_status(status: &tonic::Status) -> String {
    describe_status_with_flags(status, &[])
}

/// Request fields and the flags that set them: `(field, flag)`, where a
/// field ending in `[` stands for every element of a list (`queues[0]`).
pub(crate) type FlagNames = [(&'static str, &'static str)];

/// The flag that sets request field `field`, if any.
fn flag_of(field: &str, flags: &FlagNames) -> Option<&'static str> {
    flags.iter().find_map(|(f, flag)| {
        let hit = if f.ends_with('[') {
            field.starts_with(f)
        } else {
            field == *f
        };
        hit.then_some(*flag)
    })
}

/// [`describe_status`], naming the flag of each bad field (`budget.burst
/// (--burst): …`).
pub fn describe_status_with_flags(status: &tonic::Status, flags: &FlagNames) -> String {
    let violations = status
        .get_details_bad_request()
        .map(|b| b.field_violations)
        .unwrap_or_default();
    // The message repeats every violation on one line; they follow, one
    // per line, so say instead what an INVALID_ARGUMENT means.
    let message = if violations.is_empty() {
        status.message().to_owned()
    } else {
        "nothing was written; fix each field below".to_owned()
    };
    let mut s = format!("{:?}", status.code());
    if let Some(info) = status.get_details_error_info() {
        s.push(' ');
        s.push_str(&info.reason);
        let mut meta: Vec<_> = info.metadata.into_iter().collect();
        meta.sort();
        let meta: Vec<String> = meta.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        s.push_str(&format!(": {message}"));
        if !meta.is_empty() {
            s.push_str(&format!(" ({})", meta.join(" ")));
        }
        if info.reason == "CREDENTIAL_MISSING" {
            s.push_str(" (give --token-file or JOBFENCE_TOKEN_FILE)");
        }
    } else {
        s.push_str(&format!(": {}", status.message()));
        // Not a coordinator's answer: most often TLS on one side only (a
        // coordinator serving TLS answers a cleartext call with an
        // HTTP/2 protocol error).
        if matches!(
            status.code(),
            tonic::Code::Unknown | tonic::Code::Unavailable
        ) || status.message().contains("h2 protocol error")
        {
            s.push_str(
                " (no answer from a jobfence coordinator: check --endpoint; a coordinator \
                 with TLS needs --tls-ca or JOBFENCE_TLS_CA, one run with --insecure an http:// endpoint)",
            );
        }
    }
    for v in violations {
        match flag_of(&v.field, flags) {
            Some(flag) => s.push_str(&format!("\n  {} ({flag}): {}", v.field, v.description)),
            None => s.push_str(&format!("\n  {}: {}", v.field, v.description)),
        }
    }
    s
}

/// A refusal as the command's error (its exit status is non-zero).
/// A refusal's ErrorInfo reason, or its gRPC code when it has none.
pub(crate) fn reason_of(status: &tonic::Status) -> String {
    status
        .get_details_error_info()
        .map(|i| i.reason)
        .unwrap_or_else(|| format!("{:?}", status.code()))
}

pub(crate) fn refused(status: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!(describe_status(&status))
}

/// A refusal as the command's error, each bad field named by its flag.
pub(crate) fn refused_with_flags(status: tonic::Status, flags: &FlagNames) -> anyhow::Error {
    anyhow::anyhow!(describe_status_with_flags(&status, flags))
}

/// [`refused_with_flags`] for a read: nothing could have been written, so
/// the message does not say so.
pub(crate) fn refused_read_with_flags(status: tonic::Status, flags: &FlagNames) -> anyhow::Error {
    let said = describe_status_with_flags(&status, flags);
    anyhow::anyhow!(said.replacen(
        "nothing was written; fix each field below",
        "fix each field below",
        1
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A coordinator serving TLS answers a cleartext call with an HTTP/2
    /// protocol error (INTERNAL) or a broken transport (UNKNOWN): both are
    /// told what to give.
    #[test]
    fn a_cleartext_call_to_a_tls_coordinator_names_the_flags() {
        for status in [
            tonic::Status::internal("h2 protocol error: http2 error"),
            tonic::Status::unknown("transport error"),
        ] {
            let said = describe_status(&status);
            assert!(said.contains("--tls-ca"), "{said}");
        }
        let said = describe_status(&tonic::Status::internal("a bug"));
        assert!(!said.contains("--tls-ca"), "{said}");
    }
}

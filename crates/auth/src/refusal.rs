//! How a refusal for who the caller is reaches the caller: its ErrorInfo
//! reason (from the API's `ErrorReason`, whose `grpc_code` gives the
//! status code: UNAUTHENTICATED or PERMISSION_DENIED) and metadata. Here,
//! beside [`Refusal`], because both the authentication layer and the
//! handlers answer with it.

use crate::Refusal;
use jobfence_api::v1::ErrorReason;
use jobfence_api::ERROR_DOMAIN;
use std::collections::HashMap;
use tonic::Code;
use tonic_types::{ErrorDetails, StatusExt};

fn meta<const N: usize>(pairs: [(&str, String); N]) -> HashMap<String, String> {
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// The ErrorInfo reason of a refusal for who the caller is.
pub fn refusal_reason(refusal: &Refusal) -> ErrorReason {
    match refusal {
        Refusal::CredentialMissing => ErrorReason::CredentialMissing,
        Refusal::CredentialInvalid { .. } => ErrorReason::CredentialInvalid,
        Refusal::CredentialExpired { .. } => ErrorReason::CredentialExpired,
        Refusal::RoleNotAllowed { .. } => ErrorReason::RoleNotAllowed,
        Refusal::OperatorMismatch { .. } => ErrorReason::OperatorMismatch,
    }
}

/// The status code and ErrorInfo reason of a refusal for who the caller is.
pub fn refusal_code_and_reason(refusal: &Refusal) -> (Code, &'static str) {
    let reason = refusal_reason(refusal);
    (reason.code(), reason.as_str_name())
}

impl From<&Refusal> for tonic::Status {
    fn from(refusal: &Refusal) -> Self {
        let (code, why) = refusal_code_and_reason(refusal);
        let metadata = match refusal {
            Refusal::CredentialMissing => HashMap::new(),
            Refusal::CredentialInvalid { problem } => meta([("problem", (*problem).to_owned())]),
            Refusal::CredentialExpired { caller, expired_at } => meta([
                ("caller", caller.clone()),
                ("expired_at", expired_at.to_rfc3339()),
            ]),
            Refusal::RoleNotAllowed {
                caller,
                roles,
                method,
                required,
            } => meta([
                ("caller", caller.clone()),
                ("roles", roles.clone()),
                ("method", method.clone()),
                ("required_role", required.clone()),
            ]),
            Refusal::OperatorMismatch { caller, requested } => {
                meta([("caller", caller.clone()), ("operator", requested.clone())])
            }
        };
        let mut details = ErrorDetails::new();
        details.set_error_info(why, ERROR_DOMAIN, metadata);
        tonic::Status::with_error_details(code, refusal.to_string(), details)
    }
}

impl From<Refusal> for tonic::Status {
    fn from(refusal: Refusal) -> Self {
        tonic::Status::from(&refusal)
    }
}

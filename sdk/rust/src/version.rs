//! The API version check: every answer of a coordinator names the API
//! version it speaks in the header `jobfence-api-version`; an answer that
//! names another major version than this crate's (see
//! [`jobfence_api::MAJOR`]) is turned into a refusal the error types read
//! as [`ApiVersionError`], before the client acts on anything in it.
//!
//! An answer without the header comes from a coordinator older than the
//! header, which spoke API 1: accepted, so a rolling upgrade never refuses
//! a coordinator for its age.

use tonic::body::Body;
use tonic::codegen::http;
use tonic::codegen::Service;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The ErrorInfo domain of the refusal this crate makes itself (not the
/// coordinator's `jobfence`).
const DOMAIN: &str = "jobfence-worker";
/// Its reason.
const REASON: &str = "API_VERSION_UNSUPPORTED";

/// The coordinator speaks an API major version this client does not.
/// Nothing the coordinator answered was used; the call itself may have
/// been applied by it (a write the coordinator could read), so treat a
/// write refused this way like one whose outcome is unknown, and upgrade
/// the client (or point it at a coordinator of its major version).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the coordinator speaks API {coordinator}, this client speaks {client}.x")]
pub struct ApiVersionError {
    /// What the coordinator's `jobfence-api-version` header said.
    pub coordinator: String,
    /// The major version this client speaks ([`jobfence_api::MAJOR`]).
    pub client: String,
}

/// `Some` when `version` is not of the major version this client speaks.
fn refused(version: &str) -> Option<ApiVersionError> {
    let ours: u64 = jobfence_api::MAJOR.parse().ok()?;
    (jobfence_api::major_of(version) != Some(ours)).then(|| ApiVersionError {
        coordinator: version.to_owned(),
        client: jobfence_api::MAJOR.to_owned(),
    })
}

/// The refusal as a status (FAILED_PRECONDITION, ErrorInfo in this crate's
/// domain), as the generated client receives it.
fn refusal(e: &ApiVersionError) -> Status {
    let mut details = ErrorDetails::new();
    details.set_error_info(
        REASON,
        DOMAIN,
        [
            ("coordinator_api_version".to_owned(), e.coordinator.clone()),
            ("client_api_major".to_owned(), e.client.clone()),
        ],
    );
    Status::with_error_details(Code::FailedPrecondition, e.to_string(), details)
}

/// The [`ApiVersionError`] a status carries, if it is this check's refusal.
pub(crate) fn api_version_error(status: &Status) -> Option<ApiVersionError> {
    let info = status.get_details_error_info()?;
    (info.domain == DOMAIN && info.reason == REASON).then(|| ApiVersionError {
        coordinator: info
            .metadata
            .get("coordinator_api_version")
            .cloned()
            .unwrap_or_default(),
        client: info
            .metadata
            .get("client_api_major")
            .cloned()
            .unwrap_or_default(),
    })
}

/// A channel whose answers are checked (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct Checked {
    inner: Channel,
}

impl Checked {
    pub(crate) fn new(inner: Channel) -> Self {
        Checked { inner }
    }
}

impl Service<http::Request<Body>> for Checked {
    type Response = http::Response<Body>;
    type Error = tonic::transport::Error;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let call = self.inner.call(req);
        Box::pin(async move {
            let response = call.await?;
            let named = response
                .headers()
                .get(jobfence_api::VERSION_HEADER)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
            match named.as_deref().and_then(refused) {
                Some(e) => Ok(refusal(&e).into_http()),
                None => Ok(response),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_another_major_version_is_refused() {
        assert_eq!(refused(jobfence_api::VERSION), None);
        assert_eq!(refused(&format!("{}.99.3", jobfence_api::MAJOR)), None);
        let e = refused("2.0.0").expect("another major version");
        assert_eq!(e.coordinator, "2.0.0");
        assert!(refused("not a version").is_some());
        assert_eq!(api_version_error(&refusal(&e)), Some(e));
    }
}

//! Typed client of the fake provider, for workers and the demo.
//!
//! Its errors say what a refund worker may conclude. Only three are proof
//! that a create made no refund ([`ProviderError::Unavailable`],
//! [`ProviderError::RateLimited`], [`ProviderError::Rejected`]); every other
//! failure is an unknown outcome, which the worker must turn into
//! `reconcile`, never into "not refunded" (docs/design.md rule 5).

use super::faults::{FaultConfig, FaultKind, FAULT_HEADER};
use super::limit::{ProviderStats, RateLimitConfig};
use super::model::{ErrorBody, Ledger, Refund, RefundList, RefundParams};
use super::{IDEMPOTENCY_KEY_HEADER, RETRY_AFTER_MS_HEADER};
use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::{StatusCode, Url};
use serde::de::DeserializeOwned;
use std::net::SocketAddr;
use std::time::Duration;

/// Timeout of the `/_admin` and `/healthz` calls.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a call to the provider did not give an answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// No complete answer within the caller's timeout. **The refund may
    /// have been made** (the request may have been processed, or still be
    /// queued at the provider): reconcile.
    #[error("no answer within the timeout: the outcome is unknown")]
    Timeout,
    /// The connection closed or broke after the request may have been sent
    /// and before a complete answer arrived (e.g. the `cut_response` fault).
    /// **The refund may have been made**: reconcile.
    #[error("connection lost before the answer: the outcome is unknown ({message})")]
    ConnectionLost {
        /// Transport error, with its causes.
        message: String,
    },
    /// The provider could not be reached (`status: None`: connection
    /// refused, so nothing was sent) or answered 5xx, which this provider
    /// does only before doing anything. **No refund was made** by this
    /// call; retrying with the same idempotency key is safe.
    #[error("provider unavailable (status {status:?}): {message}")]
    Unavailable {
        /// HTTP status, if an answer came.
        status: Option<u16>,
        /// The provider's message or the transport error.
        message: String,
    },
    /// A `429`: the provider's rate limit refused the request before doing
    /// anything. **No refund was made** by this call; send it again with the
    /// same idempotency key after `retry_after`, and tell the coordinator
    /// (`FailRequest.provider_retry_after`), which holds every worker's
    /// hand-outs for this provider until then.
    #[error("rate limited by the provider (retry after {retry_after:?}): {message}")]
    RateLimited {
        /// How long the provider asked to wait: its `Retry-After-Ms` header,
        /// else `Retry-After` (delta-seconds); `None` if it sent neither (or
        /// an HTTP date, which this client does not read).
        retry_after: Option<Duration>,
        /// The provider's message.
        message: String,
    },
    /// Any other 4xx: the provider refused the request. **No refund was made** by
    /// this call (`idempotency_error`: the key already belongs to a refund
    /// with other parameters, which this call did not change).
    #[error("rejected with {status} {error_type}: {message}")]
    Rejected {
        /// HTTP status.
        status: u16,
        /// The error body's `type`: `invalid_request_error`,
        /// `idempotency_error`, … (empty if the body had none).
        error_type: String,
        /// The error body's `message`.
        message: String,
    },
    /// A 2xx whose body could not be decoded. For a create, **the refund
    /// was most likely made**: reconcile.
    #[error("undecodable answer: {message}")]
    Decode {
        /// The decoding error.
        message: String,
    },
}

impl ProviderError {
    /// Whether a [`ProviderClient::create_refund`] that failed this way may
    /// still have made the refund (so "not refunded" must not be assumed).
    pub fn refund_may_exist(&self) -> bool {
        matches!(
            self,
            ProviderError::Timeout
                | ProviderError::ConnectionLost { .. }
                | ProviderError::Decode { .. }
        )
    }
}

/// A client of one fake provider. Cheap to clone (shares one connection
/// pool).
#[derive(Debug, Clone)]
pub struct ProviderClient {
    http: reqwest::Client,
    base: Url,
    fault_header: Option<String>,
}

impl ProviderClient {
    /// A client of the provider at `base_url` (`http://HOST:PORT/`).
    /// Proxies from the environment are ignored: the provider is local.
    pub fn new(base_url: Url) -> Self {
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("a plain-HTTP client without TLS always builds");
        ProviderClient {
            http,
            base: base_url,
            fault_header: None,
        }
    }

    /// A client of the provider listening on `addr`, e.g. the address a
    /// `jobfence fake-provider` printed as `listening on ADDR`.
    pub fn for_addr(addr: SocketAddr) -> Self {
        let url = Url::parse(&format!("http://{addr}/")).expect("IP:port is a valid http URL");
        Self::new(url)
    }

    /// This client, sending `X-Fake-Fault` on every `/v1` call so that
    /// exactly `kinds` hit it (none if empty), whatever the configured
    /// probabilities.
    pub fn with_faults(&self, kinds: &[FaultKind]) -> Self {
        let value = if kinds.is_empty() {
            "none".to_owned()
        } else {
            kinds
                .iter()
                .map(|k| k.as_str())
                .collect::<Vec<_>>()
                .join(",")
        };
        ProviderClient {
            fault_header: Some(value),
            ..self.clone()
        }
    }

    /// The provider's base URL.
    pub fn base_url(&self) -> &Url {
        &self.base
    }

    fn url(&self, path: &[&str]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.pop_if_empty().extend(path);
        }
        url
    }

    /// Sends a `/v1` call (with the fault override, if any).
    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<Answer, ProviderError> {
        let request = match &self.fault_header {
            Some(value) => request.header(FAULT_HEADER, value),
            None => request,
        };
        exchange(request, timeout).await
    }

    /// `POST /v1/refunds`: makes the refund, or returns the one already
    /// made with this `idempotency_key` and the same `params` (inside the
    /// provider's retention window). `timeout` bounds the whole call.
    ///
    /// Send jobfence's `operation_key` as the key (and as
    /// `merchant_reference`), never anything derived from `attempt`.
    /// See [`ProviderError`] for what each failure means.
    pub async fn create_refund(
        &self,
        idempotency_key: &str,
        params: &RefundParams,
        timeout: Duration,
    ) -> Result<Refund, ProviderError> {
        let request = self
            .http
            .post(self.url(&["v1", "refunds"]))
            .header(IDEMPOTENCY_KEY_HEADER, idempotency_key)
            .json(params);
        decode(self.send(request, timeout).await?)
    }

    /// `GET /v1/refunds/{id}`. `Ok(None)`: the provider does not show it
    /// (yet): with read lag that is no proof it does not exist.
    pub async fn get_refund(
        &self,
        id: &str,
        timeout: Duration,
    ) -> Result<Option<Refund>, ProviderError> {
        let request = self.http.get(self.url(&["v1", "refunds", id]));
        let answer = self.send(request, timeout).await?;
        if answer.status == StatusCode::NOT_FOUND {
            let missing = serde_json::from_slice::<ErrorBody>(&answer.body)
                .is_ok_and(|b| b.error.code.as_deref() == Some("resource_missing"));
            if missing {
                return Ok(None);
            }
        }
        decode(answer).map(Some)
    }

    /// `GET /v1/refunds?merchant_reference=…`: the reconcile lookup, newest
    /// first. Empty is not proof that no refund was made (lag, a request
    /// still in flight).
    pub async fn find_by_merchant_reference(
        &self,
        merchant_reference: &str,
        timeout: Duration,
    ) -> Result<Vec<Refund>, ProviderError> {
        self.list(&[("merchant_reference", merchant_reference)], timeout)
            .await
    }

    /// `GET /v1/refunds?payment_id=…`, newest first.
    pub async fn find_by_payment_id(
        &self,
        payment_id: &str,
        timeout: Duration,
    ) -> Result<Vec<Refund>, ProviderError> {
        self.list(&[("payment_id", payment_id)], timeout).await
    }

    async fn list(
        &self,
        query: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<Vec<Refund>, ProviderError> {
        let request = self.http.get(self.url(&["v1", "refunds"])).query(query);
        decode::<RefundList>(self.send(request, timeout).await?).map(|l| l.data)
    }

    /// `GET /_admin/ledger`: the money actually moved (never faulted or
    /// lagged).
    pub async fn ledger(&self) -> Result<Ledger, ProviderError> {
        self.admin(self.http.get(self.url(&["_admin", "ledger"])))
            .await
    }

    /// `GET /_admin/report`: the settlement report of the refunds created
    /// in `[from, to)` (Unix seconds; `None`: unbounded), as `format`
    /// (`csv` or `stripe`), written to `out` as it arrives (a report can be
    /// large). Returns the bytes written.
    pub async fn report(
        &self,
        from: Option<u64>,
        to: Option<u64>,
        format: &str,
        out: &mut (dyn std::io::Write + Send),
    ) -> Result<u64, ProviderError> {
        let mut query: Vec<(&str, String)> = vec![("format", format.to_owned())];
        if let Some(f) = from {
            query.push(("from", f.to_string()));
        }
        if let Some(t) = to {
            query.push(("to", t.to_string()));
        }
        let answer = exchange(
            self.http.get(self.url(&["_admin", "report"])).query(&query),
            Duration::from_secs(600),
        )
        .await?;
        if !answer.status.is_success() {
            return Err(ProviderError::Rejected {
                status: answer.status.as_u16(),
                error_type: String::new(),
                message: String::from_utf8_lossy(&answer.body).into_owned(),
            });
        }
        out.write_all(&answer.body)
            .map_err(|e| ProviderError::Decode {
                message: format!("writing the report: {e}"),
            })?;
        Ok(answer.body.len() as u64)
    }

    /// `POST /_admin/refunds`: a refund made outside the idempotent API (as
    /// by hand in the dashboard).
    pub async fn refund_outside(&self, params: &RefundParams) -> Result<Refund, ProviderError> {
        self.admin(
            self.http
                .post(self.url(&["_admin", "refunds"]))
                .json(params),
        )
        .await
    }

    /// `POST /_admin/refunds/{merchant_reference}/again`: the same refund a
    /// second time (a double refund).
    pub async fn refund_again(&self, merchant_reference: &str) -> Result<Refund, ProviderError> {
        self.admin(
            self.http
                .post(self.url(&["_admin", "refunds", merchant_reference, "again"])),
        )
        .await
    }

    /// `GET /_admin/faults`.
    pub async fn faults(&self) -> Result<FaultConfig, ProviderError> {
        self.admin(self.http.get(self.url(&["_admin", "faults"])))
            .await
    }

    /// `PUT /_admin/faults`: replaces the fault configuration; returns it.
    pub async fn set_faults(&self, faults: &FaultConfig) -> Result<FaultConfig, ProviderError> {
        self.admin(self.http.put(self.url(&["_admin", "faults"])).json(faults))
            .await
    }

    /// `GET /_admin/stats`: requests counted, refused by the rate limit,
    /// and the peak per second.
    pub async fn stats(&self) -> Result<ProviderStats, ProviderError> {
        self.admin(self.http.get(self.url(&["_admin", "stats"])))
            .await
    }

    /// `GET /_admin/rate-limit`.
    pub async fn rate_limit(&self) -> Result<RateLimitConfig, ProviderError> {
        self.admin(self.http.get(self.url(&["_admin", "rate-limit"])))
            .await
    }

    /// `PUT /_admin/rate-limit`: replaces the rate limit (the budget starts
    /// full again); returns the one in force.
    pub async fn set_rate_limit(
        &self,
        limit: &RateLimitConfig,
    ) -> Result<RateLimitConfig, ProviderError> {
        self.admin(
            self.http
                .put(self.url(&["_admin", "rate-limit"]))
                .json(limit),
        )
        .await
    }

    /// `GET /healthz`: `Ok` once the provider serves.
    pub async fn health(&self) -> Result<(), ProviderError> {
        let request = self.http.get(self.url(&["healthz"]));
        let answer = exchange(request, ADMIN_TIMEOUT).await?;
        if answer.status.is_success() {
            Ok(())
        } else {
            Err(rejection(answer))
        }
    }

    /// Admin calls are never faulted, so they carry no override.
    async fn admin<T: DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<T, ProviderError> {
        decode(exchange(request, ADMIN_TIMEOUT).await?)
    }
}

/// A complete answer, whatever its status.
struct Answer {
    status: StatusCode,
    body: Vec<u8>,
    /// From `Retry-After-Ms`, else `Retry-After` (delta-seconds).
    retry_after: Option<Duration>,
}

async fn exchange(
    request: reqwest::RequestBuilder,
    timeout: Duration,
) -> Result<Answer, ProviderError> {
    let response = request.timeout(timeout).send().await.map_err(transport)?;
    let status = response.status();
    let retry_after = retry_after(response.headers());
    let body = response.bytes().await.map_err(transport)?;
    Ok(Answer {
        status,
        body: body.to_vec(),
        retry_after,
    })
}

/// The wait a provider asked for: `Retry-After-Ms` (milliseconds, this
/// fake's precise one) if present, else `Retry-After` as delta-seconds.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let number = |name| {
        headers
            .get(name)?
            .to_str()
            .ok()?
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|n| n.is_finite() && *n >= 0.0)
    };
    number(RETRY_AFTER_MS_HEADER)
        .map(|ms| ms / 1000.0)
        .or_else(|| number(RETRY_AFTER.as_str()))
        .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
}

fn decode<T: DeserializeOwned>(answer: Answer) -> Result<T, ProviderError> {
    if !answer.status.is_success() {
        return Err(rejection(answer));
    }
    serde_json::from_slice(&answer.body).map_err(|e| ProviderError::Decode {
        message: e.to_string(),
    })
}

fn rejection(answer: Answer) -> ProviderError {
    let Answer {
        status,
        body,
        retry_after,
    } = answer;
    let detail = serde_json::from_slice::<ErrorBody>(&body)
        .ok()
        .map(|b| b.error);
    let message = detail.as_ref().map_or_else(
        || String::from_utf8_lossy(&body).into_owned(),
        |d| d.message.clone(),
    );
    if status == StatusCode::TOO_MANY_REQUESTS {
        ProviderError::RateLimited {
            retry_after,
            message,
        }
    } else if status.is_server_error() {
        ProviderError::Unavailable {
            status: Some(status.as_u16()),
            message,
        }
    } else {
        ProviderError::Rejected {
            status: status.as_u16(),
            error_type: detail.map(|d| d.error_type).unwrap_or_default(),
            message,
        }
    }
}

/// Classifies a transport failure by what it proves about the request.
fn transport(e: reqwest::Error) -> ProviderError {
    let message = chain(&e);
    // A failed connect (even one that timed out) sent nothing.
    if e.is_connect() || e.is_builder() {
        ProviderError::Unavailable {
            status: None,
            message,
        }
    } else if e.is_timeout() {
        ProviderError::Timeout
    } else {
        ProviderError::ConnectionLost { message }
    }
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    message
}

//! HTTP routes: the Stripe-style `/v1` refund API (where the rate limit and
//! faults apply), the `/_admin` endpoints (never limited or faulted) and
//! `/healthz`.

use super::faults::{parse_fault_header, FaultConfig, FaultInjector, Faults, FAULT_HEADER};
use super::limit::{RateLimitConfig, RateLimiter};
use super::model::{ErrorBody, ErrorDetail, RefundList, RefundParams};
use super::state::{Created, KeyReused, RefundBook};
use axum::body::Bytes;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// Request header carrying the idempotency key of a create.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";
/// Response header set to `true` when a create was answered from the
/// idempotency record instead of making a refund.
pub const IDEMPOTENT_REPLAYED_HEADER: &str = "idempotent-replayed";
/// Response header of a `429`: how long to wait, in milliseconds (rounded
/// up), next to the standard `Retry-After`, which has whole seconds only.
pub const RETRY_AFTER_MS_HEADER: &str = "retry-after-ms";
/// Longest idempotency key accepted (Stripe's limit).
const MAX_KEY_LEN: usize = 255;

/// Everything the handlers share.
#[derive(Debug)]
pub(crate) struct AppState {
    pub(crate) book: RefundBook,
    pub(crate) faults: FaultInjector,
    pub(crate) limit: RateLimiter,
}

/// Per-connection handle a handler uses to drop its own connection without
/// answering. The accept loop in `server.rs` owns the other end.
#[derive(Debug, Clone, Default)]
pub(crate) struct CutSignal(pub(crate) Arc<Notify>);

impl CutSignal {
    /// Asks the connection task to drop the connection, then waits to be
    /// dropped with it: nothing this request would have answered is sent.
    async fn cut(&self) -> ! {
        self.0.notify_one();
        std::future::pending().await
    }
}

pub(crate) fn router(state: Arc<AppState>) -> Router {
    // The limit is a layer in front of the handlers: a refused request never
    // reaches one, so it cannot make a refund or record a key.
    let v1 = Router::new()
        .route("/v1/refunds", get(list_refunds).post(create_refund))
        .route("/v1/refunds/{id}", get(get_refund))
        .route_layer(middleware::from_fn_with_state(state.clone(), rate_limit));
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .merge(v1)
        .route("/_admin/ledger", get(ledger))
        .route("/_admin/faults", get(get_faults).put(put_faults))
        .route("/_admin/stats", get(stats))
        .route("/_admin/report", get(report))
        .route("/_admin/refunds", axum::routing::post(refund_outside))
        .route(
            "/_admin/refunds/{merchant_reference}/again",
            axum::routing::post(refund_again),
        )
        .route(
            "/_admin/rate-limit",
            get(get_rate_limit).put(put_rate_limit),
        )
        .with_state(state)
}

/// Counts every `/v1` request and answers `429` past the rate limit, before
/// the request's faults are drawn and before any work.
async fn rate_limit(State(app): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    match app.limit.admit() {
        Ok(()) => next.run(request).await,
        Err(wait) => {
            tracing::debug!(retry_after_ms = wait.as_millis() as u64, "rate limited");
            too_many_requests(wait)
        }
    }
}

/// Stripe's answer past its rate limit, with how long to wait in whole
/// seconds (`Retry-After`, rounded up) and in milliseconds.
fn too_many_requests(wait: Duration) -> Response {
    let ms = wait.as_nanos().div_ceil(1_000_000);
    let secs = wait.as_nanos().div_ceil(1_000_000_000);
    let mut response = error(
        StatusCode::TOO_MANY_REQUESTS,
        "invalid_request_error",
        Some("rate_limit"),
        format!("Too many requests: the rate limit was exceeded; retry after {ms} ms (nothing was done)"),
    );
    let headers = response.headers_mut();
    headers.insert(header::RETRY_AFTER, HeaderValue::from(secs as u64));
    headers.insert(RETRY_AFTER_MS_HEADER, HeaderValue::from(ms as u64));
    response
}

fn error(status: StatusCode, error_type: &str, code: Option<&str>, message: String) -> Response {
    let body = ErrorBody {
        error: ErrorDetail {
            error_type: error_type.to_owned(),
            code: code.map(str::to_owned),
            message,
        },
    };
    (status, Json(body)).into_response()
}

fn invalid(message: impl Into<String>) -> Response {
    error(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        None,
        message.into(),
    )
}

/// Runs `work` under this request's faults: 503 and hang before it, cut
/// and latency after it, lag passed into it.
async fn faulted(
    app: &AppState,
    headers: &HeaderMap,
    cut: &CutSignal,
    work: impl FnOnce(&Faults) -> Response,
) -> Response {
    let forced = match headers.get(FAULT_HEADER).map(HeaderValue::to_str) {
        None => None,
        Some(Ok(v)) => match parse_fault_header(v) {
            Ok(kinds) => Some(kinds),
            Err(e) => return invalid(format!("{FAULT_HEADER}: {e}")),
        },
        Some(Err(_)) => return invalid(format!("{FAULT_HEADER} is not ASCII")),
    };
    let faults = app.faults.decide(forced.as_deref());
    if faults.error_5xx {
        tracing::debug!(fault = "error_5xx", "injecting fault");
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "api_error",
            None,
            "injected fault: error_5xx (nothing was done)".to_owned(),
        );
    }
    if faults.hang {
        tracing::debug!(fault = "hang", "injecting fault");
        // Dropped with the connection when the client gives up.
        return std::future::pending().await;
    }
    let response = work(&faults);
    if faults.cut_response {
        tracing::debug!(fault = "cut_response", "injecting fault");
        cut.cut().await;
    }
    if let Some(latency) = faults.latency {
        tracing::debug!(
            fault = "latency",
            latency_ms = latency.as_millis(),
            "injecting fault"
        );
        tokio::time::sleep(latency).await;
    }
    response
}

async fn create_refund(
    State(app): State<Arc<AppState>>,
    Extension(cut): Extension<CutSignal>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    faulted(&app, &headers, &cut, |_| {
        let key = match headers.get(IDEMPOTENCY_KEY_HEADER).map(HeaderValue::to_str) {
            Some(Ok(k)) if !k.is_empty() && k.len() <= MAX_KEY_LEN => k,
            Some(_) => {
                return invalid(format!(
                    "Idempotency-Key must be 1..={MAX_KEY_LEN} visible ASCII characters"
                ))
            }
            None => return invalid("the Idempotency-Key header is required"),
        };
        let params: RefundParams = match serde_json::from_slice(&body) {
            Ok(p) => p,
            Err(e) => return invalid(format!("invalid body: {e}")),
        };
        if let Err(message) = validate(&params) {
            return invalid(message);
        }
        match app.book.create(key, params) {
            Ok(Created::New(refund)) => {
                tracing::info!(refund_id = %refund.id, status = ?refund.status, "refund made");
                Json(refund).into_response()
            }
            Ok(Created::Replayed(refund)) => {
                tracing::info!(refund_id = %refund.id, "idempotent replay");
                ([(IDEMPOTENT_REPLAYED_HEADER, "true")], Json(refund)).into_response()
            }
            Err(KeyReused) => error(
                StatusCode::BAD_REQUEST,
                "idempotency_error",
                None,
                format!(
                    "Keys for idempotent requests can only be used with the same parameters \
                     they were first used with. Try using a key other than '{key}' if you \
                     meant to execute a different request."
                ),
            ),
        }
    })
    .await
}

fn validate(p: &RefundParams) -> Result<(), String> {
    if p.amount <= 0 {
        return Err(format!(
            "amount must be > 0 (minor units), got {}",
            p.amount
        ));
    }
    for (name, value) in [
        ("payment_id", &p.payment_id),
        ("currency", &p.currency),
        ("merchant_reference", &p.merchant_reference),
    ] {
        if value.is_empty() {
            return Err(format!("{name} must not be empty"));
        }
    }
    Ok(())
}

async fn get_refund(
    State(app): State<Arc<AppState>>,
    Extension(cut): Extension<CutSignal>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    faulted(&app, &headers, &cut, |faults| {
        match app.book.get(&id, faults.lag) {
            Some(refund) => Json(refund).into_response(),
            None => error(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("resource_missing"),
                format!("No such refund: '{id}'"),
            ),
        }
    })
    .await
}

/// Query of `GET /v1/refunds`; both filters optional, combined with AND.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    payment_id: Option<String>,
    merchant_reference: Option<String>,
}

async fn list_refunds(
    State(app): State<Arc<AppState>>,
    Extension(cut): Extension<CutSignal>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Query(query) = match query {
        Ok(q) => q,
        Err(e) => return invalid(e.body_text()),
    };
    faulted(&app, &headers, &cut, |faults| {
        let data = app.book.list(
            query.payment_id.as_deref(),
            query.merchant_reference.as_deref(),
            faults.lag,
        );
        Json(RefundList { data }).into_response()
    })
    .await
}

/// `GET /_admin/report?from=&to=&format=`: the settlement report.
#[derive(Debug, Deserialize)]
struct ReportQuery {
    /// Unix seconds (provider clock), inclusive.
    from: Option<u64>,
    /// Unix seconds, exclusive.
    to: Option<u64>,
    /// `csv` (default) or `stripe` (Refund objects as JSON lines).
    format: Option<String>,
}

/// The settlement report of the refunds created in `[from, to)`, oldest
/// first (docs/fake-provider.md, "Settlement report"): CSV with the
/// columns `id,merchant_reference,amount,currency,status,created`, or one
/// Stripe Refund object per line, the merchant reference in
/// `metadata.operation_key` and the currency lowercase.
async fn report(State(app): State<Arc<AppState>>, Query(q): Query<ReportQuery>) -> Response {
    let refunds = app.book.report(q.from, q.to);
    match q.format.as_deref().unwrap_or("csv") {
        "csv" => {
            let mut body = String::from("id,merchant_reference,amount,currency,status,created\n");
            for r in &refunds {
                body.push_str(&format!(
                    "{},{},{},{},{},{}\n",
                    csv_field(&r.id),
                    csv_field(&r.merchant_reference),
                    r.amount,
                    csv_field(&r.currency),
                    status_name(r.status),
                    r.created
                ));
            }
            ([(header::CONTENT_TYPE, "text/csv; charset=utf-8")], body).into_response()
        }
        "stripe" => {
            let mut body = String::new();
            for r in &refunds {
                let line = serde_json::json!({
                    "id": r.id,
                    "object": "refund",
                    "amount": r.amount,
                    "currency": r.currency.to_ascii_lowercase(),
                    "status": status_name(r.status),
                    "created": r.created,
                    "payment_intent": r.payment_id,
                    "metadata": {"operation_key": r.merchant_reference},
                });
                body.push_str(&line.to_string());
                body.push('\n');
            }
            ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response()
        }
        other => invalid(format!("unknown format {other:?}: csv or stripe")),
    }
}

fn status_name(s: super::model::RefundStatus) -> &'static str {
    match s {
        super::model::RefundStatus::Pending => "pending",
        super::model::RefundStatus::Succeeded => "succeeded",
        super::model::RefundStatus::Failed => "failed",
    }
}

/// A CSV field, quoted when it holds a comma, a quote or a line break.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// `POST /_admin/refunds` (a refund's parameters): a refund made outside
/// the idempotent API, as by hand in the dashboard (for tests and the
/// demo's injected exceptions).
async fn refund_outside(State(app): State<Arc<AppState>>, body: Bytes) -> Response {
    let params: RefundParams = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => return invalid(format!("invalid refund parameters: {e}")),
    };
    if params.amount <= 0 {
        return invalid("amount must be above zero");
    }
    (StatusCode::CREATED, Json(app.book.make_outside(params))).into_response()
}

/// `POST /_admin/refunds/{merchant_reference}/again`: the same refund made
/// a second time, as a resend after its idempotency key expired would
/// (a double refund, for tests and the demo).
async fn refund_again(
    State(app): State<Arc<AppState>>,
    Path(merchant_reference): Path<String>,
) -> Response {
    match app.book.params_of(&merchant_reference) {
        Some(params) => (StatusCode::CREATED, Json(app.book.make_outside(params))).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("resource_missing"),
            format!("no refund of merchant reference {merchant_reference:?}"),
        ),
    }
}

async fn ledger(State(app): State<Arc<AppState>>) -> Response {
    Json(app.book.ledger()).into_response()
}

async fn get_faults(State(app): State<Arc<AppState>>) -> Response {
    Json(app.faults.config()).into_response()
}

async fn put_faults(State(app): State<Arc<AppState>>, body: Bytes) -> Response {
    let config: FaultConfig = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => return invalid(format!("invalid fault configuration: {e}")),
    };
    match app.faults.set_config(config) {
        Ok(()) => {
            tracing::info!(?config, "fault configuration replaced");
            Json(config).into_response()
        }
        Err(message) => invalid(message),
    }
}

async fn stats(State(app): State<Arc<AppState>>) -> Response {
    Json(app.limit.stats()).into_response()
}

async fn get_rate_limit(State(app): State<Arc<AppState>>) -> Response {
    Json(app.limit.config()).into_response()
}

async fn put_rate_limit(State(app): State<Arc<AppState>>, body: Bytes) -> Response {
    let config: RateLimitConfig = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => return invalid(format!("invalid rate limit: {e}")),
    };
    match app.limit.set_config(config) {
        Ok(in_force) => {
            tracing::info!(?in_force, "rate limit replaced");
            Json(in_force).into_response()
        }
        Err(message) => invalid(message),
    }
}

//! HTTP routes: the Stripe-style `/v1` refund API (where faults apply), the
//! `/_admin` endpoints (never faulted) and `/healthz`.

use super::faults::{parse_fault_header, FaultConfig, FaultInjector, Faults, FAULT_HEADER};
use super::model::{ErrorBody, ErrorDetail, RefundList, RefundParams};
use super::state::{Created, KeyReused, RefundBook};
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use serde::Deserialize;
use std::sync::Arc;
use tokio::sync::Notify;

/// Request header carrying the idempotency key of a create.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";
/// Response header set to `true` when a create was answered from the
/// idempotency record instead of making a refund.
pub const IDEMPOTENT_REPLAYED_HEADER: &str = "idempotent-replayed";
/// Longest idempotency key accepted (Stripe's limit).
const MAX_KEY_LEN: usize = 255;

/// Everything the handlers share.
#[derive(Debug)]
pub(crate) struct AppState {
    pub(crate) book: RefundBook,
    pub(crate) faults: FaultInjector,
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
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/v1/refunds", get(list_refunds).post(create_refund))
        .route("/v1/refunds/{id}", get(get_refund))
        .route("/_admin/ledger", get(ledger))
        .route("/_admin/faults", get(get_faults).put(put_faults))
        .with_state(state)
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

//! Limits that hold under abuse: how many calls run at once, in all and
//! per caller, and how long one may take. A call past a concurrency limit
//! is answered RESOURCE_EXHAUSTED / `OVERLOADED` at once (with a
//! RetryInfo), before its request body is read, instead of queueing: a
//! flood costs the server a header parse per call, and its memory stays
//! flat. The other limits are set on the listener itself (see
//! [`Limits`]): request size, connections, HTTP/2 streams per connection.
//!
//! Health checks are exempt: a load balancer must see a busy coordinator
//! as busy, not as down. Reflection, open to callers without a credential,
//! has a small pool of its own ([`REFLECTION_CALLS`]): anonymous streams
//! held open cannot take the slots of authenticated callers.

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use jobfence_auth::Caller;
use jobfence_metrics::Metrics;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

/// Every limit of the gRPC listener. The defaults are the documented ones
/// (docs/configuration.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest request message, in bytes (`--max-request-size`); a larger
    /// one is refused INVALID_ARGUMENT / `INVALID_REQUEST` (metadata
    /// `max_request_bytes`) before any handler sees it.
    pub max_request_bytes: usize,
    /// Open connections at most (`--max-connections`).
    pub max_connections: usize,
    /// HTTP/2 streams (calls) one connection may have open at once
    /// (`--max-streams-per-connection`, sent as
    /// SETTINGS_MAX_CONCURRENT_STREAMS: clients queue past it).
    pub max_streams_per_connection: u32,
    /// Calls in flight in all (`--max-concurrent-calls`): unary calls
    /// until answered, streams while open, long-polling Claims while they
    /// wait.
    pub max_calls: usize,
    /// Calls in flight of one authenticated caller
    /// (`--max-calls-per-caller`), so one flooding credential cannot take
    /// every slot.
    pub max_calls_per_caller: usize,
    /// The server-side deadline of one call (`--call-timeout`): past it
    /// the call is answered DEADLINE_EXCEEDED (its outcome unknown to the
    /// caller). A client's own shorter `grpc-timeout` is kept; a longer
    /// one, or none, is cut to this.
    pub call_timeout: Duration,
    /// How long a client has to finish its TLS handshake.
    pub handshake_timeout: Duration,
    /// How long a connection may stay open without a call that
    /// authenticated (`--unauthenticated-connection-timeout`), when the
    /// server authenticates its callers: connections held open by someone
    /// without a credential cannot take every connection slot for good.
    /// Health checks and reflection calls do not count as authenticated.
    pub unauthenticated_connection_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_request_bytes: 4 << 20,
            max_connections: 1024,
            max_streams_per_connection: 128,
            max_calls: 1024,
            max_calls_per_caller: 256,
            call_timeout: Duration::from_secs(60),
            handshake_timeout: Duration::from_secs(10),
            unauthenticated_connection_timeout: Duration::from_secs(10),
        }
    }
}

/// Reflection calls (`grpc.reflection.*`, no credential needed) in flight
/// at most; they do not count toward [`Limits::max_calls`].
pub const REFLECTION_CALLS: usize = 8;

/// Counts of the calls in flight.
#[derive(Debug, Default)]
struct InFlight {
    all: usize,
    by_caller: HashMap<String, usize>,
    reflection: usize,
}

/// The shared state of [`AdmissionLayer`].
#[derive(Debug)]
struct Admission {
    limits: Limits,
    metrics: Metrics,
    in_flight: Mutex<InFlight>,
}

/// A call's place under the limits; given back when dropped.
struct Slot {
    admission: Arc<Admission>,
    caller: Option<String>,
    /// A slot of the reflection pool, not of the global one.
    reflection: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut f = self
            .admission
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if self.reflection {
            f.reflection -= 1;
            return;
        }
        f.all -= 1;
        if let Some(name) = &self.caller {
            if let Some(n) = f.by_caller.get_mut(name) {
                *n -= 1;
                if *n == 0 {
                    f.by_caller.remove(name);
                }
            }
        }
    }
}

impl Admission {
    /// A slot for a call of `caller`, or the status refusing it.
    fn admit(self: &Arc<Self>, caller: Option<&Caller>) -> Result<Slot, tonic::Status> {
        let mut f = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        if f.all >= self.limits.max_calls {
            let n = f.all;
            drop(f);
            self.metrics.overload_refusal("global");
            return Err(crate::grpc::status::overloaded("global", n));
        }
        if let Some(c) = caller {
            let mine = f.by_caller.get(&c.name).copied().unwrap_or(0);
            if mine >= self.limits.max_calls_per_caller {
                drop(f);
                self.metrics.overload_refusal("caller");
                return Err(crate::grpc::status::overloaded("caller", mine));
            }
            *f.by_caller.entry(c.name.clone()).or_insert(0) += 1;
        }
        f.all += 1;
        Ok(Slot {
            admission: self.clone(),
            caller: caller.map(|c| c.name.clone()),
            reflection: false,
        })
    }

    /// A slot of the reflection pool, or the status refusing it.
    fn admit_reflection(self: &Arc<Self>) -> Result<Slot, tonic::Status> {
        let mut f = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        if f.reflection >= REFLECTION_CALLS {
            let n = f.reflection;
            drop(f);
            self.metrics.overload_refusal("reflection");
            return Err(crate::grpc::status::overloaded("reflection", n));
        }
        f.reflection += 1;
        Ok(Slot {
            admission: self.clone(),
            caller: None,
            reflection: true,
        })
    }
}

/// Admits calls under the concurrency limits and the server-side deadline
/// of [`Limits`]. Sits after the authentication layer (it counts per
/// authenticated caller).
#[derive(Debug, Clone)]
pub struct AdmissionLayer {
    admission: Arc<Admission>,
}

impl AdmissionLayer {
    /// Enforces `limits`; counts refusals in `metrics`.
    pub fn new(limits: Limits, metrics: Metrics) -> Self {
        AdmissionLayer {
            admission: Arc::new(Admission {
                limits,
                metrics,
                in_flight: Mutex::new(InFlight::default()),
            }),
        }
    }
}

impl<S> tower_layer::Layer<S> for AdmissionLayer {
    type Service = Admit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Admit {
            inner,
            admission: self.admission.clone(),
        }
    }
}

/// The service [`AdmissionLayer`] wraps around.
#[derive(Debug, Clone)]
pub struct Admit<S> {
    inner: S,
    admission: Arc<Admission>,
}

/// Whether `response` is a trailers-only gRPC answer OUT_OF_RANGE without
/// status details: tonic's codec refusing an oversized message. A
/// coordinator's own OUT_OF_RANGE (EVENTS_CURSOR_PRUNED) carries an
/// ErrorInfo in `grpc-status-details-bin` and passes unchanged.
fn is_out_of_range<B>(response: &http::Response<B>) -> bool {
    let headers = response.headers();
    headers
        .get("grpc-status")
        .is_some_and(|v| v.as_bytes() == b"11")
        && !headers.contains_key("grpc-status-details-bin")
}

/// `grpc-timeout` value for `d` (milliseconds, at most 8 digits).
/// The client-streaming import of a provider's settlement report.
const IMPORT_SETTLEMENT: &str = "/jobfence.v1.JobAdmin/ImportSettlement";
/// The server-side deadline of a settlement import.
const IMPORT_TIMEOUT: Duration = Duration::from_secs(3600);

fn grpc_timeout(d: Duration) -> http::HeaderValue {
    let ms = d.as_millis().clamp(1, 99_999_999);
    http::HeaderValue::from_str(&format!("{ms}m")).expect("digits and a unit")
}

impl<S, ReqBody, ResBody> tower_service::Service<http::Request<ReqBody>> for Admit<S>
where
    S: tower_service::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: Body<Data = Bytes> + Default + Send + 'static,
{
    type Response = http::Response<SlotBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<ReqBody>) -> Self::Future {
        if req.uri().path().starts_with("/grpc.health.v1.Health/") {
            let call = self.inner.call(req);
            return Box::pin(async move { Ok(call.await?.map(SlotBody::free)) });
        }
        let caller = req.extensions().get::<Arc<Caller>>().cloned();
        let admitted = if req.uri().path().starts_with("/grpc.reflection.") {
            self.admission.admit_reflection()
        } else {
            self.admission.admit(caller.as_deref())
        };
        let slot = match admitted {
            Ok(slot) => slot,
            Err(status) => {
                return Box::pin(std::future::ready(Ok(status
                    .into_http::<ResBody>()
                    .map(SlotBody::free))));
            }
        };
        // The handlers see the server's deadline as the call's own (a
        // long-polling Claim answers empty before it). A settlement import
        // streams a whole report file in and is answered at its end: it
        // gets an hour (an import cut off is run again, and changes nothing
        // twice).
        let mut limit = self.admission.limits.call_timeout;
        if req.uri().path() == IMPORT_SETTLEMENT {
            limit = limit.max(IMPORT_TIMEOUT);
        }
        let asked = req
            .headers()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(crate::grpc::parse_grpc_timeout);
        if asked.is_none_or(|d| d > limit) {
            req.headers_mut()
                .insert("grpc-timeout", grpc_timeout(limit));
        }
        let call = self.inner.call(req);
        let admission = self.admission.clone();
        Box::pin(async move {
            match tokio::time::timeout(limit, call).await {
                // tonic's codec refuses a message over --max-request-size as
                // OUT_OF_RANGE, without an ErrorInfo (ours always carry
                // one): answer INVALID_REQUEST instead.
                Ok(Ok(response)) if is_out_of_range(&response) => {
                    admission.metrics.overload_refusal("request_size");
                    let max = admission.limits.max_request_bytes;
                    Ok(crate::grpc::status::request_too_large(max)
                        .into_http::<ResBody>()
                        .map(SlotBody::free))
                }
                // A stream keeps its slot while it is open.
                Ok(response) => Ok(response?.map(|inner| SlotBody {
                    inner,
                    slot: Some(slot),
                })),
                Err(_) => {
                    let status = tonic::Status::deadline_exceeded(format!(
                        "no answer within the server's call timeout of {}",
                        humantime::format_duration(limit)
                    ));
                    Ok(status.into_http::<ResBody>().map(SlotBody::free))
                }
            }
        })
    }
}

pin_project_lite::pin_project! {
    /// A response body holding its call's [`Slot`] until it ends.
    pub struct SlotBody<B> {
        #[pin]
        inner: B,
        slot: Option<Slot>,
    }
}

impl<B> SlotBody<B> {
    fn free(inner: B) -> Self {
        SlotBody { inner, slot: None }
    }
}

impl<B: Default> Default for SlotBody<B> {
    fn default() -> Self {
        SlotBody::free(B::default())
    }
}

impl<B: Body<Data = Bytes>> Body for SlotBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        let frame = std::task::ready!(this.inner.poll_frame(cx));
        if frame.is_none() {
            this.slot.take();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

//! The response header `jobfence-api-version` on every gRPC answer, so a
//! client can refuse a coordinator whose API major version it does not
//! speak before it acts on anything that coordinator said.
//!
//! A tower layer outermost on the server: answers of every service, and
//! refusals made by the other layers (authentication, admission), carry
//! it. In a trailers-only answer (a refusal) the headers are the only
//! metadata block, so the header is there too.

use http::HeaderValue;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Adds `jobfence-api-version: <version>` to every response.
#[derive(Debug, Clone)]
pub struct ApiVersionLayer {
    value: HeaderValue,
}

impl ApiVersionLayer {
    /// Names `version` (normally [`jobfence_api::VERSION`]).
    ///
    /// Errors: a version that is not a valid header value.
    pub fn new(version: &str) -> anyhow::Result<Self> {
        Ok(ApiVersionLayer {
            value: HeaderValue::from_str(version)
                .map_err(|_| anyhow::anyhow!("API version {version:?} is not a header value"))?,
        })
    }
}

impl<S> tower_layer::Layer<S> for ApiVersionLayer {
    type Service = ApiVersion<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ApiVersion {
            inner,
            value: self.value.clone(),
        }
    }
}

/// The service [`ApiVersionLayer`] wraps around.
#[derive(Debug, Clone)]
pub struct ApiVersion<S> {
    inner: S,
    value: HeaderValue,
}

impl<S, ReqBody, ResBody> tower_service::Service<http::Request<ReqBody>> for ApiVersion<S>
where
    S: tower_service::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<ResBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        let value = self.value.clone();
        let call = self.inner.call(req);
        Box::pin(async move {
            let mut response = call.await?;
            response
                .headers_mut()
                .insert(jobfence_api::VERSION_HEADER, value);
            Ok(response)
        })
    }
}

//! ListWorkers, and the sightings the worker calls leave (see
//! crates/core/src/workers.rs: a map update per call, written every 5 s).

use super::convert::{duration, duration_to_proto};
use super::Rpc;
use jobfence_api::v1 as proto;
use jobfence_core::workers::{client_of, WorkerView, DEFAULT_STALE_AFTER, DEFAULT_WITHIN};
use jobfence_core::Coordinator;
use jobfence_domain::validate::Violations;
use std::time::Duration;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

/// The client a call's user-agent names (see [`client_of`]).
pub(super) fn client(metadata: &MetadataMap) -> String {
    client_of(metadata.get("user-agent").and_then(|v| v.to_str().ok()))
}

/// A call from `worker_id` on `queue`, made with `client`, that the
/// caller's scope allows: noted (a call refused for its scope, or with a
/// field the coordinator refuses, is not).
pub(super) fn saw(coordinator: &Coordinator, client: &str, worker_id: &str, queue: &str) {
    coordinator.sightings().saw(worker_id, queue, client);
}

/// ListWorkers.
pub(super) async fn list(
    rpc: Rpc<'_>,
    coordinator: &Coordinator,
    request: Request<proto::ListWorkersRequest>,
) -> Result<Response<proto::ListWorkersResponse>, Status> {
    rpc.read(request, |r| async move {
        let mut v = Violations::default();
        let stale_after = duration(&mut v, "stale_after", r.stale_after);
        let within = duration(&mut v, "within", r.within);
        v.finish()?;
        let workers = coordinator
            .workers(
                stale_after.unwrap_or(DEFAULT_STALE_AFTER),
                within.unwrap_or(DEFAULT_WITHIN),
            )
            .await?;
        Ok(proto::ListWorkersResponse {
            workers: workers.into_iter().map(worker).collect(),
        })
    })
    .await
}

fn worker(w: WorkerView) -> proto::Worker {
    proto::Worker {
        worker_id: w.worker_id,
        client: w.client,
        coordinator: w.coordinator,
        queue: w.queue,
        last_call_ago: Some(duration_to_proto(w.last_call_ago)),
        first_seen_ago: Some(duration_to_proto(w.first_seen_ago)),
        calls_per_minute: w.calls_per_minute,
        held: w
            .held
            .into_iter()
            .map(|j| proto::HeldJob {
                job_id: j.job_id,
                queue: j.queue,
                attempt: j.attempt,
                lease_left: Some(signed_duration(j.lease_left_us)),
            })
            .collect(),
        live: w.live,
    }
}

/// Microseconds, negative too, as a protobuf Duration (seconds and nanos
/// share the sign).
fn signed_duration(us: i64) -> prost_types::Duration {
    let d = duration_to_proto(Duration::from_micros(us.unsigned_abs()));
    if us < 0 {
        prost_types::Duration {
            seconds: -d.seconds,
            nanos: -d.nanos,
        }
    } else {
        d
    }
}

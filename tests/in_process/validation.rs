//! Bad input gets INVALID_ARGUMENT with a field violation for each problem,
//! and nothing is written; enqueue is idempotent on (queue, operation_key).

use jobfence_testkit as kit;

use jobfence_api::v1::{
    ClaimRequest, CompleteRequest, EnqueueRequest, FailRequest, GetJobRequest,
    RecordObservationRequest, RenewLeaseRequest, TakeoverRequest,
};
use kit::{meta, reason, secs, Harness};
use sqlx::Row;
use tonic::Code;
use tonic_types::StatusExt;

const Q: &str = "refunds";

/// The fields named by the BadRequest detail.
fn fields(status: &tonic::Status) -> Vec<String> {
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(reason(status), "INVALID_REQUEST");
    status
        .get_details_bad_request()
        .expect("BadRequest detail")
        .field_violations
        .into_iter()
        .map(|v| v.field)
        .collect()
}

async fn counts(h: &Harness) -> (i64, i64, i64) {
    let n = |t: &'static str| {
        let pool = h.pool.clone();
        async move {
            sqlx::query(&format!("SELECT COUNT(*) AS n FROM {t}"))
                .fetch_one(&pool)
                .await
                .unwrap()
                .get::<i64, _>("n")
        }
    };
    (
        n("jobs").await,
        n("job_events").await,
        n("job_observations").await,
    )
}

fn enqueue(queue: &str, key: &str, payload: &str) -> EnqueueRequest {
    EnqueueRequest {
        queue: queue.into(),
        operation_key: key.into(),
        payload: payload.into(),
        delay: None,
        fairness_key: String::new(),
        priority: 0,
    }
}

#[tokio::test]
async fn malformed_enqueues_are_refused_and_write_nothing() {
    let h = Harness::start().await;
    let mut c = h.client.clone();
    let cases: Vec<(EnqueueRequest, Vec<&str>)> = vec![
        (enqueue(Q, "", "{}"), vec!["operation_key"]),
        (enqueue(Q, &"k".repeat(256), "{}"), vec!["operation_key"]),
        (enqueue("", "k", "{}"), vec!["queue"]),
        (enqueue("bad queue!", "k", "{}"), vec!["queue"]),
        (enqueue(Q, "k", &"x".repeat(65_537)), vec!["payload"]),
        (
            enqueue("", "", &"x".repeat(65_537)),
            vec!["queue", "operation_key", "payload"],
        ),
        (
            EnqueueRequest {
                delay: secs(-5),
                ..enqueue(Q, "k", "{}")
            },
            vec!["delay"],
        ),
    ];
    for (req, want) in cases {
        let status = c.enqueue(req).await.unwrap_err();
        assert_eq!(fields(&status), want);
    }
    // 255 bytes of a multi-byte key is fine; 256 bytes is not.
    let ok_key = "é".repeat(127) + "k";
    assert_eq!(ok_key.len(), 255);
    assert_eq!(counts(&h).await, (0, 0, 0), "nothing written");
    c.enqueue(enqueue(Q, &ok_key, "{}")).await.unwrap();
    h.finish().await;
}

#[tokio::test]
async fn malformed_worker_calls_are_refused_and_write_nothing() {
    let h = Harness::start().await;
    let job = h.enqueue(Q, "refund-1", "{}").await;
    let a = h.claim_one(Q, "w").await;
    let before = counts(&h).await;
    let row = h.row(job.job_id).await;
    let mut c = h.client.clone();

    let claim = |max_jobs, lease| ClaimRequest {
        queue: Q.into(),
        worker_id: "w".into(),
        max_jobs,
        lease,
        wait: None,
    };
    assert_eq!(
        fields(&c.claim(claim(0, None)).await.unwrap_err()),
        ["max_jobs"]
    );
    assert_eq!(
        fields(&c.claim(claim(101, None)).await.unwrap_err()),
        ["max_jobs"]
    );
    assert_eq!(
        fields(&c.claim(claim(1, secs(0))).await.unwrap_err()),
        ["lease"]
    );
    assert_eq!(
        fields(&c.claim(claim(1, secs(-1))).await.unwrap_err()),
        ["lease"]
    );
    assert_eq!(
        fields(&c.claim(claim(1, secs(7200))).await.unwrap_err()),
        ["lease"]
    );
    let no_worker = ClaimRequest {
        worker_id: String::new(),
        ..claim(1, None)
    };
    assert_eq!(
        fields(&c.claim(no_worker).await.unwrap_err()),
        ["worker_id"]
    );
    let negative_wait = ClaimRequest {
        wait: secs(-1),
        ..claim(1, None)
    };
    assert_eq!(fields(&c.claim(negative_wait).await.unwrap_err()), ["wait"]);

    let missing_attempt = c
        .complete(CompleteRequest {
            job_id: job.job_id,
            attempt: 0,
            provider_reference: "re".into(),
            result: String::new(),
            next: None,
        })
        .await
        .unwrap_err();
    assert_eq!(fields(&missing_attempt), ["attempt"]);
    let bad_fail = c
        .fail(FailRequest {
            job_id: job.job_id,
            attempt: a.attempt,
            disposition: 99,
            error: String::new(),
            retry_delay: None,
            provider_retry_after: None,
            next: None,
        })
        .await
        .unwrap_err();
    // Every field at once: the disposition the server could not read and
    // the error the coordinator's checks want.
    assert_eq!(fields(&bad_fail), ["disposition", "error"]);
    let unset_fail = c
        .fail(FailRequest {
            job_id: job.job_id,
            attempt: a.attempt,
            disposition: 0,
            error: "x".into(),
            retry_delay: secs(-1),
            provider_retry_after: None,
            next: None,
        })
        .await
        .unwrap_err();
    assert_eq!(fields(&unset_fail), ["disposition", "retry_delay"]);
    let no_error = c
        .fail(FailRequest {
            job_id: job.job_id,
            attempt: a.attempt,
            disposition: 1,
            error: String::new(),
            retry_delay: None,
            provider_retry_after: None,
            next: None,
        })
        .await
        .unwrap_err();
    assert_eq!(fields(&no_error), ["error"]);
    let renew = c
        .renew_lease(RenewLeaseRequest {
            job_id: 0,
            attempt: a.attempt,
            lease: secs(0),
        })
        .await
        .unwrap_err();
    assert_eq!(fields(&renew), ["job_id", "lease"]);
    let take = c
        .takeover(TakeoverRequest {
            job_id: job.job_id,
            worker_id: "w".repeat(256),
            lease: None,
        })
        .await
        .unwrap_err();
    assert_eq!(fields(&take), ["worker_id"]);
    let obs = c
        .record_observation(RecordObservationRequest {
            job_id: job.job_id,
            attempt: 1,
            source: 0,
            outcome: 42,
            provider_reference: String::new(),
            body: String::new(),
            dedup_key: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(fields(&obs), ["source", "outcome"]);
    let obs = c
        .record_observation(RecordObservationRequest {
            job_id: job.job_id,
            attempt: 1,
            source: 1,
            outcome: 1,
            provider_reference: String::new(),
            body: String::new(),
            dedup_key: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(fields(&obs), ["dedup_key"]);

    assert_eq!(counts(&h).await, before, "nothing written");
    assert_eq!(h.row(job.job_id).await, row);
    h.finish().await;
}

#[tokio::test]
async fn unknown_jobs_are_not_found() {
    let h = Harness::start().await;
    let mut c = h.client.clone();
    let s = c
        .complete(CompleteRequest {
            job_id: 4242,
            attempt: 1,
            provider_reference: String::new(),
            result: String::new(),
            next: None,
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::NotFound);
    assert_eq!(reason(&s), "JOB_NOT_FOUND");
    assert_eq!(meta(&s, "job_id"), "4242");
    let s = c.get_job(GetJobRequest { job_id: 4242 }).await.unwrap_err();
    assert_eq!(reason(&s), "JOB_NOT_FOUND");
    let s = c
        .record_observation(RecordObservationRequest {
            job_id: 4242,
            attempt: 0,
            source: 2,
            outcome: 1,
            provider_reference: String::new(),
            body: "{}".into(),
            dedup_key: "webhook-1".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&s), "JOB_NOT_FOUND");
    let s = c
        .takeover(TakeoverRequest {
            job_id: 4242,
            worker_id: "w".into(),
            lease: None,
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&s), "JOB_NOT_FOUND");
    assert_eq!(counts(&h).await, (0, 0, 0));
    h.finish().await;
}

/// docs/design.md rule 14: a finished job's operation key is not forgotten. An
/// Enqueue of the key of a succeeded (or failed) job answers with that job,
/// never a new one that would send the operation a second time; another
/// payload under it is a conflict; nothing is written either way.
#[tokio::test]
async fn a_finished_jobs_operation_key_is_never_enqueued_again() {
    let h = Harness::start().await;
    let mut c = h.client.clone();
    let payload = r#"{"amount":500}"#;
    let mut finished = Vec::new();
    for (key, fail) in [("refund-done", false), ("refund-failed", true)] {
        let job = c
            .enqueue(enqueue(Q, key, payload))
            .await
            .unwrap()
            .into_inner()
            .job
            .unwrap();
        let held = h.claim_one(Q, "w").await;
        assert_eq!(held.job_id, job.job_id);
        if fail {
            c.fail(FailRequest {
                job_id: held.job_id,
                attempt: held.attempt,
                disposition: jobfence_api::v1::FailDisposition::Failed as i32,
                error: "refused by the provider".into(),
                retry_delay: None,
                provider_retry_after: None,
                next: None,
            })
            .await
            .unwrap();
        } else {
            c.complete(CompleteRequest {
                job_id: held.job_id,
                attempt: held.attempt,
                provider_reference: "re_1".into(),
                result: String::new(),
                next: None,
            })
            .await
            .unwrap();
        }
        finished.push((key, h.row(job.job_id).await));
    }
    let count = || async {
        let jobs: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM jobs")
            .fetch_one(&h.pool)
            .await
            .unwrap();
        let events: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM job_events")
            .fetch_one(&h.pool)
            .await
            .unwrap();
        (jobs, events)
    };
    let before = count().await;
    for (key, row) in &finished {
        let again = c
            .enqueue(enqueue(Q, key, payload))
            .await
            .unwrap()
            .into_inner();
        assert!(!again.created, "{key} was enqueued a second time");
        assert_eq!(again.job.unwrap().job_id, row.id, "{key}");
        let conflict = c
            .enqueue(enqueue(Q, key, r#"{"amount":900}"#))
            .await
            .unwrap_err();
        assert_eq!(reason(&conflict), "OPERATION_KEY_CONFLICT", "{key}");
        assert_eq!(
            &h.row(row.id).await,
            row,
            "{key}: the finished job is unchanged"
        );
    }
    assert_eq!(count().await, before, "nothing written");
    // And nothing to claim: the finished keys did not come back as work.
    assert!(h.claim(Q, "w", 5).await.is_empty());
    h.finish().await;
}

#[tokio::test]
async fn enqueue_is_idempotent_on_the_operation_key() {
    let h = Harness::start().await;
    let mut c = h.client.clone();
    let first = c
        .enqueue(enqueue(Q, "refund-pay_1", r#"{"amount":500}"#))
        .await
        .unwrap()
        .into_inner();
    assert!(first.created);
    let again = c
        .enqueue(enqueue(Q, "refund-pay_1", r#"{"amount":500}"#))
        .await
        .unwrap()
        .into_inner();
    assert!(!again.created);
    assert_eq!(
        again.job.as_ref().unwrap().job_id,
        first.job.as_ref().unwrap().job_id
    );

    let conflict = c
        .enqueue(enqueue(Q, "refund-pay_1", r#"{"amount":900}"#))
        .await
        .unwrap_err();
    assert_eq!(conflict.code(), Code::AlreadyExists);
    assert_eq!(reason(&conflict), "OPERATION_KEY_CONFLICT");
    assert_eq!(
        meta(&conflict, "job_id"),
        first.job.unwrap().job_id.to_string()
    );

    // Keys compare byte for byte, and per queue.
    assert!(
        c.enqueue(enqueue(Q, "REFUND-PAY_1", "{}"))
            .await
            .unwrap()
            .into_inner()
            .created
    );
    assert!(
        c.enqueue(enqueue("payouts", "refund-pay_1", "{}"))
            .await
            .unwrap()
            .into_inner()
            .created
    );
    assert_eq!(counts(&h).await.0, 3);

    // A delayed job is not due yet.
    c.enqueue(EnqueueRequest {
        delay: secs(3600),
        ..enqueue("later", "k", "{}")
    })
    .await
    .unwrap();
    assert!(h.claim("later", "w", 1).await.is_empty());
    h.finish().await;
}

/// An Enqueue as raw bytes on the wire: `operation_key` need not be UTF-8.
#[derive(Clone, PartialEq, prost::Message)]
struct RawEnqueue {
    #[prost(string, tag = "1")]
    queue: String,
    #[prost(bytes = "vec", tag = "2")]
    operation_key: Vec<u8>,
}

#[tokio::test]
async fn a_request_that_does_not_decode_is_invalid_not_internal() {
    let h = Harness::start().await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", h.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let status = grpc
        .unary::<_, jobfence_api::v1::EnqueueResponse, _>(
            tonic::Request::new(RawEnqueue {
                queue: Q.into(),
                operation_key: vec![0xff, 0xfe, b'k'],
            }),
            http::uri::PathAndQuery::from_static("/jobfence.v1.JobCoordinator/Enqueue"),
            tonic_prost::ProstCodec::<RawEnqueue, jobfence_api::v1::EnqueueResponse>::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(fields(&status), ["(message)"]);
    assert_eq!(counts(&h).await, (0, 0, 0), "nothing written");
    h.finish().await;
}

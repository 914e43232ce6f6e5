//! The one rule for request strings (docs/api.md, "Strings"): `""` is not
//! given, a value made only of whitespace is refused with a field violation
//! naming the field, and nothing is written; the settlement calls read it
//! as every other call does.

use jobfence_testkit as kit;

use crate::settlement::{provider, P};
use jobfence_api::v1::job_admin_client::JobAdminClient;
use jobfence_api::v1::{
    ClaimRequest, CompleteRequest, EnqueueRequest, GetJobRequest, GetSettlementRequest, JobState,
    ListJobsRequest, ListSettlementExceptionsRequest, PauseQueueRequest,
    PutSettlementSettingsRequest, SettlementColumns,
};
use kit::{reason, secs, Harness};
use tonic::transport::Channel;
use tonic::Code;
use tonic_types::StatusExt;

const Q: &str = "refunds";
const BLANK: &str = "must not be blank (only whitespace)";

/// The (field, description) pairs of an INVALID_REQUEST refusal.
fn violations(status: &tonic::Status) -> Vec<(String, String)> {
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(reason(status), "INVALID_REQUEST");
    status
        .get_details_bad_request()
        .expect("BadRequest detail")
        .field_violations
        .into_iter()
        .map(|v| (v.field, v.description))
        .collect()
}

fn blank(field: &str) -> Vec<(String, String)> {
    vec![(field.to_owned(), BLANK.to_owned())]
}

async fn admin(h: &Harness) -> JobAdminClient<Channel> {
    JobAdminClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap()
}

async fn count(h: &Harness, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
        .fetch_one(&h.pool)
        .await
        .unwrap()
}

fn settings(columns: SettlementColumns) -> PutSettlementSettingsRequest {
    PutSettlementSettingsRequest {
        provider: P.into(),
        preset: "fake".into(),
        columns: Some(columns),
        lag: None,
        queues: vec![],
        operator: "alice".into(),
        reason: "blank strings".into(),
    }
}

#[tokio::test]
async fn settlement_calls_refuse_a_blank_string_and_take_an_empty_one_as_not_given() {
    let h = Harness::start().await;
    provider(&h).await;
    let mut admin = admin(&h).await;
    let stored = || async {
        let mut admin = self::admin(&h).await;
        let all = admin
            .get_settlement(GetSettlementRequest { provider: P.into() })
            .await
            .unwrap()
            .into_inner();
        all.providers[0].settings.clone().unwrap()
    };
    let before = stored().await;
    let changes = count(&h, "policy_changes").await;

    // A blank column used to mean "the preset's": now it is refused.
    let refused = admin
        .put_settlement_settings(settings(SettlementColumns {
            amount: " ".into(),
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(violations(&refused), blank("columns.amount"));
    let refused = admin
        .put_settlement_settings(PutSettlementSettingsRequest {
            preset: "\t".into(),
            ..settings(SettlementColumns::default())
        })
        .await
        .unwrap_err();
    assert_eq!(violations(&refused), blank("preset"));
    assert_eq!(stored().await, before, "nothing written");
    assert_eq!(count(&h, "policy_changes").await, changes);

    // An empty column is not given: the preset's is kept.
    let put = admin
        .put_settlement_settings(settings(SettlementColumns::default()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(put.settings.unwrap().columns, before.columns);

    // The filters: blank refused, empty = every provider.
    let refused = admin
        .get_settlement(GetSettlementRequest {
            provider: "  ".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(violations(&refused), blank("provider"));
    let every = admin
        .get_settlement(GetSettlementRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(every.providers.len(), 1);
    let refused = admin
        .list_settlement_exceptions(ListSettlementExceptionsRequest {
            provider: " ".into(),
            states: vec!["\n".into()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    let mut want = blank("provider");
    want.extend(blank("states[0]"));
    want.sort();
    let mut got = violations(&refused);
    got.sort();
    assert_eq!(got, want);
    admin
        .list_settlement_exceptions(ListSettlementExceptionsRequest::default())
        .await
        .unwrap();
    h.finish().await;
}

#[tokio::test]
async fn worker_and_admin_calls_refuse_a_blank_string_and_write_nothing() {
    let h = Harness::start().await;
    let mut c = h.client.clone();
    let mut admin = admin(&h).await;

    let refused = c
        .enqueue(EnqueueRequest {
            queue: Q.into(),
            operation_key: " \t".into(),
            payload: "{}".into(),
            delay: None,
            fairness_key: String::new(),
            priority: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(violations(&refused), blank("operation_key"));
    assert_eq!(count(&h, "jobs").await, 0, "nothing written");

    // A payload is content: spaces are kept as sent.
    let job = c
        .enqueue(EnqueueRequest {
            queue: Q.into(),
            operation_key: "refund-1".into(),
            payload: "  ".into(),
            delay: None,
            fairness_key: String::new(),
            priority: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    assert_eq!(job.payload, "  ");

    let refused = c
        .claim(ClaimRequest {
            queue: Q.into(),
            worker_id: "\t".into(),
            max_jobs: 1,
            lease: secs(30),
            wait: None,
        })
        .await
        .unwrap_err();
    assert_eq!(violations(&refused), blank("worker_id"));
    let claimed = c
        .claim(ClaimRequest {
            queue: Q.into(),
            worker_id: "w1".into(),
            max_jobs: 1,
            lease: secs(30),
            wait: None,
        })
        .await
        .unwrap()
        .into_inner();
    let attempt = claimed.jobs[0].job.as_ref().unwrap().attempt;

    // An optional string: blank refused (the job stays running), empty
    // taken as "no reference".
    // The result is content, kept as the provider answered it, blank
    // or not.
    let complete = |provider_reference: &str| CompleteRequest {
        job_id: job.job_id,
        attempt,
        provider_reference: provider_reference.into(),
        result: "\n".into(),
        next: None,
    };
    let refused = c.complete(complete(" ")).await.unwrap_err();
    assert_eq!(violations(&refused), blank("provider_reference"));
    let now = c
        .get_job(GetJobRequest { job_id: job.job_id })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    assert_eq!(now.state, JobState::Running as i32, "nothing written");
    let done = c.complete(complete("")).await.unwrap().into_inner();
    let done = done.job.unwrap();
    assert_eq!(done.state, JobState::Succeeded as i32);
    assert_eq!(done.provider_reference, "");
    assert_eq!(done.result, "\n", "a result of whitespace is kept as sent");

    // An admin filter: blank refused, empty = every queue.
    let refused = admin
        .list_jobs(ListJobsRequest {
            queue: " ".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(violations(&refused), blank("queue"));
    let all = admin
        .list_jobs(ListJobsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(all.jobs.len(), 1);

    // An operator named by blanks is a blank field, not someone else.
    let refused = admin
        .pause_queue(PauseQueueRequest {
            queue: Q.into(),
            operator: " ".into(),
            reason: "maintenance".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(violations(&refused), blank("operator"));
    assert_eq!(count(&h, "queue_policies").await, 0, "nothing written");
    h.finish().await;
}

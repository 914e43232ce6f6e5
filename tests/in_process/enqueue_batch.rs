//! EnqueueBatch: one transaction for many items, each answered as a single
//! Enqueue of it would be (created, the same request again, or a conflict
//! of its own), and a batch with any bad item refused whole with a field
//! violation per problem and nothing written.

use jobfence_testkit as kit;

use jobfence_api::v1::{enqueue_batch_result, EnqueueBatchRequest, EnqueueRequest};
use kit::{reason, Harness};
use sqlx::Row;
use tonic::Code;
use tonic_types::StatusExt;

const Q: &str = "refunds";

fn item(key: &str, payload: &str) -> EnqueueRequest {
    EnqueueRequest {
        queue: Q.into(),
        operation_key: key.into(),
        payload: payload.into(),
        delay: None,
        fairness_key: String::new(),
        priority: 0,
    }
}

async fn count(h: &Harness, sql: &str) -> i64 {
    sqlx::query(sql).fetch_one(&h.pool).await.unwrap().get(0)
}

#[tokio::test]
async fn each_item_gets_the_answer_an_enqueue_of_it_would_get() {
    let h = Harness::start().await;
    let existing = h.enqueue(Q, "refund-old", "{\"amount\":1}").await;
    let items = vec![
        item("refund-new-1", "{\"amount\":2}"),
        item("refund-old", "{\"amount\":1}"), // the same request again
        item("refund-old", "{\"amount\":999}"), // same key, other payload
        item("refund-new-2", "{\"amount\":3}"),
        item("refund-new-1", "{\"amount\":2}"), // repeated inside the batch
        item("refund-new-2", "{\"amount\":4}"), // conflicts inside the batch
    ];
    let results = h
        .client
        .clone()
        .enqueue_batch(EnqueueBatchRequest { items })
        .await
        .unwrap()
        .into_inner()
        .results;
    assert_eq!(results.len(), 6);
    let ok = |i: usize| match &results[i].result {
        Some(enqueue_batch_result::Result::Enqueued(e)) => e.clone(),
        other => panic!("item {i}: {other:?}"),
    };
    let err = |i: usize| match &results[i].result {
        Some(enqueue_batch_result::Result::Error(e)) => e.clone(),
        other => panic!("item {i}: {other:?}"),
    };
    let new1 = ok(0);
    assert!(new1.created);
    let old = ok(1);
    assert!(!old.created);
    assert_eq!(old.job.unwrap().job_id, existing.job_id);
    let conflict = err(2);
    assert_eq!(conflict.code, Code::AlreadyExists as i32);
    assert_eq!(conflict.reason, "OPERATION_KEY_CONFLICT");
    assert_eq!(conflict.metadata["job_id"], existing.job_id.to_string());
    assert!(ok(3).created);
    let again = ok(4);
    assert!(
        !again.created,
        "only the first item naming a key creates it"
    );
    assert_eq!(again.job.unwrap().job_id, new1.job.as_ref().unwrap().job_id);
    assert_eq!(err(5).reason, "OPERATION_KEY_CONFLICT");

    assert_eq!(count(&h, "SELECT COUNT(*) FROM jobs").await, 3);
    assert_eq!(
        count(
            &h,
            "SELECT COUNT(*) FROM job_events WHERE kind = 'enqueued'"
        )
        .await,
        3,
        "one event per job created"
    );
    // The answers are the rows as stored.
    let stored = h.row(new1.job.as_ref().unwrap().job_id).await;
    assert_eq!(stored.payload, "{\"amount\":2}");
    assert_eq!(
        jobfence_server::grpc::convert::job(stored),
        new1.job.unwrap(),
        "answer and row agree"
    );

    // The same batch again creates nothing.
    let results = h
        .client
        .clone()
        .enqueue_batch(EnqueueBatchRequest {
            items: vec![
                item("refund-new-1", "{\"amount\":2}"),
                item("refund-new-2", "{\"amount\":3}"),
            ],
        })
        .await
        .unwrap()
        .into_inner()
        .results;
    for r in results {
        match r.result {
            Some(enqueue_batch_result::Result::Enqueued(e)) => assert!(!e.created),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(count(&h, "SELECT COUNT(*) FROM jobs").await, 3);
    h.finish().await;
}

#[tokio::test]
async fn a_batch_with_a_bad_item_is_refused_whole_naming_each_problem() {
    let h = Harness::start().await;
    let items = vec![
        item("refund-ok", "{}"),
        EnqueueRequest {
            queue: "bad queue".into(),
            ..item("refund-2", "{}")
        },
        item("", "{}"),
        item("refund-trailing ", "{}"),
        EnqueueRequest {
            delay: kit::secs(-5),
            ..item("refund-5", "{}")
        },
        item("refund-big", &"x".repeat(65_537)),
    ];
    let status = h
        .client
        .clone()
        .enqueue_batch(EnqueueBatchRequest { items })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(reason(&status), "INVALID_REQUEST");
    let mut fields: Vec<String> = status
        .get_details_bad_request()
        .expect("BadRequest detail")
        .field_violations
        .into_iter()
        .map(|v| v.field)
        .collect();
    fields.sort();
    assert_eq!(
        fields,
        [
            "items[1].queue",
            "items[2].operation_key",
            "items[3].operation_key",
            "items[4].delay",
            "items[5].payload",
        ]
    );
    assert_eq!(
        count(&h, "SELECT COUNT(*) FROM jobs").await,
        0,
        "nothing written"
    );
    assert_eq!(count(&h, "SELECT COUNT(*) FROM job_events").await, 0);

    let empty = h
        .client
        .clone()
        .enqueue_batch(EnqueueBatchRequest { items: vec![] })
        .await
        .unwrap_err();
    assert_eq!(empty.code(), Code::InvalidArgument);
    let too_many = h
        .client
        .clone()
        .enqueue_batch(EnqueueBatchRequest {
            items: (0..1001).map(|i| item(&format!("k{i}"), "{}")).collect(),
        })
        .await
        .unwrap_err();
    assert_eq!(too_many.code(), Code::InvalidArgument);
    assert!(
        too_many.message().contains("at most 1000"),
        "{}",
        too_many.message()
    );
    assert_eq!(count(&h, "SELECT COUNT(*) FROM jobs").await, 0);
    h.finish().await;
}

/// Atomic across its insert statements: with the database refusing one
/// item of a later statement (a trigger of the test's own database; the
/// rows go in key order, so `big-40` is in the second of three), none of
/// the batch is written, not the first statement's rows nor any event;
/// without the trigger the same batch writes all 50.
#[tokio::test]
async fn a_batch_larger_than_one_insert_statement_goes_in_one_transaction() {
    let h = Harness::start().await;
    // 50 items of 60 KiB (under gRPC's 4 MiB message limit): three 1 MiB
    // insert statements (18, 18 and 14 items).
    let payload = "y".repeat(60 * 1024);
    let items: Vec<EnqueueRequest> = (0..50)
        .map(|i| item(&format!("big-{i}"), &payload))
        .collect();
    sqlx::query(
        "CREATE TRIGGER refuse_big_40 BEFORE INSERT ON jobs FOR EACH ROW \
         IF NEW.operation_key = 'big-40' THEN \
         SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused by the test'; END IF",
    )
    .execute(&h.pool)
    .await
    .unwrap();
    let refused = h
        .client
        .clone()
        .enqueue_batch(EnqueueBatchRequest {
            items: items.clone(),
        })
        .await
        .expect_err("the database refused an item of the second statement");
    assert!(
        format!("{refused:?}").contains("refused by the test"),
        "{refused:?}"
    );
    assert_eq!(
        count(&h, "SELECT COUNT(*) FROM jobs").await,
        0,
        "nothing written"
    );
    assert_eq!(count(&h, "SELECT COUNT(*) FROM job_events").await, 0);

    sqlx::query("DROP TRIGGER refuse_big_40")
        .execute(&h.pool)
        .await
        .unwrap();
    let results = h
        .client
        .clone()
        .enqueue_batch(EnqueueBatchRequest { items })
        .await
        .unwrap()
        .into_inner()
        .results;
    assert_eq!(results.len(), 50);
    assert_eq!(count(&h, "SELECT COUNT(*) FROM jobs").await, 50);
    assert_eq!(
        count(
            &h,
            "SELECT COUNT(*) FROM jobs WHERE LENGTH(payload) = 61440"
        )
        .await,
        50
    );
    assert_eq!(count(&h, "SELECT COUNT(*) FROM job_events").await, 50);
    h.finish().await;
}

/// An Enqueue whose key another transaction is inserting (its row not yet
/// committed, held here on the default MariaDB with lock waits of 1 s)
/// waits on the unique key, times out, is run again and counted, and
/// answers once the other transaction has ended: created when it rolled
/// back, the other's job when it committed. Never an outage.
#[tokio::test]
async fn an_enqueue_behind_an_uncommitted_insert_of_its_key_is_run_again_and_counted() {
    for holder_commits in [false, true] {
        let h = Harness::start_with_lock_wait(1).await;
        let mut holder = h.db.pool().begin().await.unwrap();
        sqlx::query(
            "INSERT INTO jobs (queue, operation_key, request_digest, payload, state, attempt, \
             next_action, run_at, dispatch_count, created_at, updated_at) \
             VALUES (?, 'refund-held', UNHEX(SHA2('other', 256)), 'other', 'ready', 0, 'execute', \
             UTC_TIMESTAMP(6), 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
        )
        .bind(Q)
        .execute(&mut *holder)
        .await
        .unwrap();
        let store = h.coordinator.store().clone();
        let before = store.conflicts();
        let mut client = h.another_client().await;
        let sent = tokio::spawn(async move { client.enqueue(item("refund-held", "{}")).await });
        kit::until(
            "the enqueue's lock wait timed out and was run again",
            || store.conflicts().0 > before.0,
        )
        .await;
        if holder_commits {
            holder.commit().await.unwrap();
        } else {
            holder.rollback().await.unwrap();
        }
        let answer = sent.await.unwrap();
        let (retried, reported) = store.conflicts();
        assert!(retried > before.0, "retried {retried}");
        assert_eq!(reported, before.1, "no conflict reached the caller");
        if holder_commits {
            // The key now names the other's job, with another payload.
            let status = answer.expect_err("the other's payload differs");
            assert_eq!(status.code(), Code::AlreadyExists, "{status:?}");
            assert_eq!(reason(&status), "OPERATION_KEY_CONFLICT");
        } else {
            assert!(
                answer
                    .expect("created after the rollback")
                    .into_inner()
                    .created
            );
        }
        let n = count(
            &h,
            "SELECT COUNT(*) FROM jobs WHERE operation_key = 'refund-held'",
        )
        .await;
        assert_eq!(n, 1);
        h.finish().await;
    }
}

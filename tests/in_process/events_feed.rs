//! The events feed (outbox): a consumer that stores its cursor sees every
//! completion exactly once, across a coordinator restart; an event id that
//! is allocated but not yet committed holds the feed instead of being
//! skipped.

use jobfence_testkit as kit;

use jobfence_api::v1::job_events_client::JobEventsClient;
use jobfence_api::v1::{
    ClaimRequest, CompleteRequest, EnqueueRequest, JobState, ListEventsRequest, WatchEventsRequest,
};
use kit::ops::{drop_db, fresh_db, Coord};
use sqlx::mysql::MySqlPool;
use sqlx::{Connection, Executor};
use std::collections::BTreeMap;
use std::time::Duration;
use tonic::transport::Channel;
use tonic::Code;

const Q: &str = "refunds";

/// Enqueues, claims and completes one job; returns its id.
async fn complete_one(c: &Coord, key: &str) -> u64 {
    let mut w = c.worker().await;
    let job = w
        .enqueue(EnqueueRequest {
            queue: Q.into(),
            operation_key: key.into(),
            payload: "{}".into(),
            delay: None,
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    let claimed = w
        .claim(ClaimRequest {
            queue: Q.into(),
            worker_id: "w".into(),
            max_jobs: 1,
            lease: None,
            wait: None,
        })
        .await
        .unwrap()
        .into_inner()
        .jobs
        .remove(0)
        .job
        .unwrap();
    assert_eq!(claimed.job_id, job.job_id);
    w.complete(CompleteRequest {
        job_id: job.job_id,
        attempt: claimed.attempt,
        provider_reference: format!("re_{key}"),
        result: String::new(),
    })
    .await
    .unwrap();
    job.job_id
}

/// A downstream business system: applies each outcome and stores the
/// cursor with it, as one step.
#[derive(Default)]
struct Consumer {
    cursor: u64,
    applied: BTreeMap<u64, u32>,
    seen_ids: Vec<u64>,
}

impl Consumer {
    /// Reads the stream until `want` outcomes in total have been applied.
    async fn follow(&mut self, client: &mut JobEventsClient<Channel>, want: usize) {
        let mut stream = client
            .watch_events(WatchEventsRequest {
                after_event_id: self.cursor,
                queue: Q.into(),
            })
            .await
            .unwrap()
            .into_inner();
        while self.applied.values().sum::<u32>() < want as u32 {
            let msg = tokio::time::timeout(Duration::from_secs(10), stream.message())
                .await
                .expect("the feed delivers within 10 s")
                .unwrap()
                .expect("the stream stays open");
            let e = msg.event.unwrap();
            assert!(e.event_id > self.cursor, "served in order, never twice");
            self.seen_ids.push(e.event_id);
            if e.to_state == JobState::Succeeded as i32 {
                *self.applied.entry(e.job_id).or_default() += 1;
            }
            self.cursor = e.event_id;
        }
    }
}

#[tokio::test]
async fn consumer_resumes_across_a_restart_and_sees_every_completion_once() {
    let (db, pool) = fresh_db().await;
    let mut first = Coord::start(&pool).await;
    let j1 = complete_one(&first, "r1").await;
    let j2 = complete_one(&first, "r2").await;

    let mut consumer = Consumer::default();
    let mut client = first.events().await;
    consumer.follow(&mut client, 2).await;
    assert_eq!(
        consumer.applied.keys().copied().collect::<Vec<_>>(),
        [j1, j2]
    );

    // A stream still open when the coordinator shuts down ends with a
    // precise, retryable status instead of holding the shutdown open.
    let mut open = client
        .watch_events(WatchEventsRequest {
            after_event_id: consumer.cursor,
            queue: Q.into(),
        })
        .await
        .unwrap()
        .into_inner();
    first.stop().await;
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match open.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("stream ended without a status"),
                Err(status) => return status,
            }
        }
    })
    .await
    .expect("the stream ends at shutdown");
    assert_eq!(end.code(), Code::Unavailable);
    assert_eq!(kit::reason(&end), "SERVER_SHUTTING_DOWN");

    // Work goes on at a new coordinator process on the same database.
    let mut second = Coord::start(&pool).await;
    let j3 = complete_one(&second, "r3").await;
    let j4 = complete_one(&second, "r4").await;
    let mut client = second.events().await;
    consumer.follow(&mut client, 4).await;

    let expected: BTreeMap<u64, u32> = [(j1, 1), (j2, 1), (j3, 1), (j4, 1)].into();
    assert_eq!(consumer.applied, expected, "every completion exactly once");
    let mut sorted = consumer.seen_ids.clone();
    sorted.dedup();
    assert_eq!(sorted, consumer.seen_ids, "no event delivered twice");
    assert!(consumer.seen_ids.windows(2).all(|w| w[0] < w[1]));
    second.stop().await;
    drop_db(db, pool).await;
}

async fn list(c: &Coord, after: u64) -> (Vec<u64>, u64) {
    let page = c
        .events()
        .await
        .list_events(ListEventsRequest {
            after_event_id: after,
            limit: 100,
            queue: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    (
        page.events.iter().map(|e| e.event_id).collect(),
        page.next_after_event_id,
    )
}

/// Inserts an event in an open transaction of its own: its id is
/// allocated, its row invisible until COMMIT.
async fn open_writer(pool: &MySqlPool, job_id: u64) -> (sqlx::MySqlConnection, u64) {
    let url = pool.connect_options();
    let mut conn = sqlx::MySqlConnection::connect_with(&url).await.unwrap();
    conn.execute("BEGIN").await.unwrap();
    let done = sqlx::query(
        "INSERT INTO job_events (job_id, queue, attempt, kind, current_attempt, created_at) \
         VALUES (?, 'refunds', 0, 'test_slow_writer', 0, UTC_TIMESTAMP(6))",
    )
    .bind(job_id)
    .execute(&mut conn)
    .await
    .unwrap();
    (conn, done.last_insert_id())
}

#[tokio::test]
async fn an_uncommitted_event_id_holds_the_feed_instead_of_being_skipped() {
    let (db, pool) = fresh_db().await;
    let mut c = Coord::start(&pool).await;
    let j1 = complete_one(&c, "h1").await;
    let (base, _) = list(&c, 0).await;
    let cursor = *base.last().unwrap();

    // A slow writer takes the next id; a later transaction commits first.
    let (mut slow, hole) = open_writer(&pool, j1).await;
    assert_eq!(hole, cursor + 1);
    complete_one(&c, "h2").await;
    let visible: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM job_events WHERE id > ?")
        .bind(hole)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(visible > 0, "later events are committed and visible");
    let (held, next) = list(&c, cursor).await;
    assert_eq!(held, Vec::<u64>::new(), "nothing is served past the hole");
    assert_eq!(next, cursor, "the cursor does not move past the hole");

    // The slow writer commits: its event is served, in order, then the rest.
    slow.execute("COMMIT").await.unwrap();
    let (served, _) = list(&c, cursor).await;
    assert_eq!(served[0], hole);
    assert!(served.windows(2).all(|w| w[0] < w[1]));
    let last = *served.last().unwrap();

    // A writer that rolls back leaves a hole that never fills: once it has
    // ended, the feed moves past it.
    let (mut gone, hole2) = open_writer(&pool, j1).await;
    complete_one(&c, "h3").await;
    let (held, next) = list(&c, last).await;
    assert!(held.is_empty());
    assert_eq!(next, last);
    gone.execute("ROLLBACK").await.unwrap();
    // The hole now has no row; it is passed once the event after it is
    // older than the allocation grace (aged on the test data, no sleeping).
    let (held, _) = list(&c, last).await;
    assert!(held.is_empty(), "a fresh rowless hole is waited out");
    sqlx::query(
        "UPDATE job_events SET created_at = DATE_SUB(created_at, INTERVAL 5 SECOND) WHERE id > ?",
    )
    .bind(hole2)
    .execute(&pool)
    .await
    .unwrap();
    let (after, _) = list(&c, last).await;
    assert!(!after.contains(&hole2));
    assert_eq!(after[0], hole2 + 1);
    c.stop().await;
    drop_db(db, pool).await;
}

#[tokio::test]
async fn list_events_filters_by_queue_and_the_cursor_moves_past_other_queues() {
    let (db, pool) = fresh_db().await;
    let mut c = Coord::start(&pool).await;
    complete_one(&c, "q1").await;
    let mut w = c.worker().await;
    w.enqueue(EnqueueRequest {
        queue: "payouts".into(),
        operation_key: "p1".into(),
        payload: "{}".into(),
        delay: None,
    })
    .await
    .unwrap();
    let mut events = c.events().await;
    let page = events
        .list_events(ListEventsRequest {
            after_event_id: 0,
            limit: 0,
            queue: "payouts".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(page.events.len(), 1);
    let e = &page.events[0];
    assert_eq!((e.kind.as_str(), e.queue.as_str()), ("enqueued", "payouts"));
    assert_eq!(e.operation_key, "p1");
    assert_eq!(e.to_state, JobState::Ready as i32);
    assert_eq!(page.next_after_event_id, e.event_id);

    // Paged by two: the cursor of a full page is its last event.
    let page = events
        .list_events(ListEventsRequest {
            after_event_id: 0,
            limit: 2,
            queue: Q.into(),
        })
        .await
        .unwrap()
        .into_inner();
    let kinds: Vec<_> = page.events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["enqueued", "claimed"]);
    assert_eq!(page.next_after_event_id, page.events[1].event_id);
    let rest = events
        .list_events(ListEventsRequest {
            after_event_id: page.next_after_event_id,
            limit: 2,
            queue: Q.into(),
        })
        .await
        .unwrap()
        .into_inner();
    let kinds: Vec<_> = rest.events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["completed"]);
    assert_eq!(rest.events[0].detail, "re_q1");
    // Past the last refunds event: the payouts event is skipped over.
    assert!(rest.next_after_event_id > rest.events[0].event_id);

    let bad = events
        .list_events(ListEventsRequest {
            after_event_id: 0,
            limit: 5000,
            queue: "bad queue".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert_eq!(kit::reason(&bad), "INVALID_REQUEST");
    c.stop().await;
    drop_db(db, pool).await;
}

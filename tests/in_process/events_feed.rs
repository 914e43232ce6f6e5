//! The events feed (outbox): a consumer that stores its cursor sees every
//! completion exactly once, across a coordinator restart; an event id that
//! is allocated but not yet committed holds the feed instead of being
//! skipped.

use jobfence_testkit as kit;

use jobfence_api::v1::job_events_client::JobEventsClient;
use jobfence_api::v1::{
    ClaimRequest, CompleteRequest, EnqueueRequest, JobState, ListEventsRequest, TakeoverRequest,
    TakeoverResponse, WatchEventsRequest,
};
use jobfence_store::PausePoint;
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
            fairness_key: String::new(),
            priority: 0,
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
        next: None,
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
        fairness_key: String::new(),
        priority: 0,
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

/// A real coordinator write held open with its event written: a
/// Takeover paused after its `taken_over` event took the next id, before
/// COMMIT. Later events commit, and are aged past the allocation grace,
/// so only the lock probe can tell that the hole is still being written.
struct HeldWriter {
    h: kit::Harness,
    gate: jobfence_store::Armed,
    takeover: tokio::task::JoinHandle<Result<tonic::Response<TakeoverResponse>, tonic::Status>>,
    /// The last event id served before the writer began.
    cursor: u64,
    /// The id the paused takeover's event holds.
    hole: u64,
}

async fn held_writer() -> HeldWriter {
    let h = kit::Harness::start().await;
    let j1 = h.enqueue(Q, "held-1", "{}").await;
    h.claim_one(Q, "worker-a").await;
    h.force_lease_expired(j1.job_id).await;
    let cursor: u64 = sqlx::query_scalar("SELECT MAX(id) FROM job_events")
        .fetch_one(&h.pool)
        .await
        .unwrap();

    let mut gate = h.pauses.arm(PausePoint::TakeoverBeforeCommit);
    let mut b = h.another_client().await;
    let takeover = tokio::spawn(async move {
        b.takeover(TakeoverRequest {
            job_id: j1.job_id,
            worker_id: "worker-b".into(),
            lease: None,
        })
        .await
    });
    gate.reached().await;
    let hole = cursor + 1;

    // Later events commit while the takeover is open...
    let j2 = h.enqueue(Q, "held-2", "{}").await;
    let c = h.claim_one(Q, "worker-c").await;
    assert_eq!(c.job_id, j2.job_id, "the held row is skipped");
    h.client
        .clone()
        .complete(CompleteRequest {
            job_id: j2.job_id,
            attempt: c.attempt,
            provider_reference: "re_2".into(),
            result: String::new(),
            next: None,
        })
        .await
        .unwrap();
    // ...and are made older than the allocation grace (test data only).
    let aged = sqlx::query(
        "UPDATE job_events SET created_at = DATE_SUB(created_at, INTERVAL 5 SECOND) WHERE id > ?",
    )
    .bind(hole)
    .execute(&h.pool)
    .await
    .unwrap()
    .rows_affected();
    assert_eq!(aged, 3, "enqueued, claimed, completed of the second job");
    HeldWriter {
        h,
        gate,
        takeover,
        cursor,
        hole,
    }
}

async fn events_client(h: &kit::Harness) -> JobEventsClient<Channel> {
    JobEventsClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap()
}

async fn list_after(h: &kit::Harness, after: u64) -> (Vec<u64>, u64) {
    let page = events_client(h)
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

#[tokio::test]
async fn list_events_holds_at_a_paused_takeovers_event_even_when_the_later_ones_are_old() {
    let HeldWriter {
        h,
        mut gate,
        takeover,
        cursor,
        hole,
    } = held_writer().await;
    let (held, next) = list_after(&h, cursor).await;
    assert_eq!(held, Vec::<u64>::new(), "nothing is served past the hole");
    assert_eq!(next, cursor, "the cursor does not move past the hole");

    // A page that decided its horizon while the writer was open serves up
    // to that horizon only, even if the writer commits before it reads.
    let mut page_gate = h.pauses.arm(PausePoint::EventsAfterHorizon);
    let h_events = events_client(&h).await;
    let page = tokio::spawn(async move {
        let mut c = h_events;
        c.list_events(ListEventsRequest {
            after_event_id: cursor,
            limit: 100,
            queue: String::new(),
        })
        .await
    });
    page_gate.reached().await;
    gate.release();
    takeover.await.unwrap().expect("the takeover commits");
    page_gate.release();
    let page = page.await.unwrap().unwrap().into_inner();
    assert!(page.events.is_empty(), "decided before the commit");
    assert_eq!(page.next_after_event_id, cursor);

    // Committed: the held event comes first, then the rest, in order.
    let (served, _) = list_after(&h, cursor).await;
    assert_eq!(served, (hole..hole + 4).collect::<Vec<_>>());
    h.finish().await;
}

#[tokio::test]
async fn watch_events_holds_at_a_paused_takeovers_event_even_when_the_later_ones_are_old() {
    let HeldWriter {
        h,
        mut gate,
        takeover,
        cursor,
        hole,
    } = held_writer().await;
    // Every poll of the stream stops after deciding its horizon; let three
    // pass (the up-front check and two polls of the stream), so at least
    // one poll decided and delivered while the writer was open and the
    // later events were old.
    let mut page_gate = h.pauses.arm(PausePoint::EventsAfterHorizon);
    let mut watcher = events_client(&h).await;
    // The call answers only after its up-front check, which pauses too.
    let stream = tokio::spawn(async move {
        watcher
            .watch_events(WatchEventsRequest {
                after_event_id: cursor,
                queue: String::new(),
            })
            .await
    });
    for _ in 0..2 {
        page_gate.reached().await;
        page_gate = h.pauses.arm(PausePoint::EventsAfterHorizon);
    }
    page_gate.reached().await;
    gate.release();
    takeover.await.unwrap().expect("the takeover commits");
    page_gate.release();

    let mut stream = stream.await.unwrap().unwrap().into_inner();
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let msg = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("the feed delivers within 10 s")
            .unwrap()
            .expect("the stream stays open");
        seen.push(msg.event.unwrap().event_id);
    }
    assert_eq!(
        seen,
        (hole..hole + 4).collect::<Vec<_>>(),
        "the held event first, nothing skipped"
    );
    h.finish().await;
}

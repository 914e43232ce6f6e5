//! What operators do to a provider's budget, against the real database: pause
//! and resume, the in-flight cap, a budget changed while coordinators run,
//! bad budget input refused field by field, and a stored policy winning over
//! every coordinator's flags; and queues sharing a provider taking turns
//! (docs/design.md rules 11–13).

use super::*;

/// An operator's pause: everything, or sends only while reconciles (a
/// takeover, a retry to reconcile) go on; stored, so a coordinator started
/// later holds too; a resume lets the sends through.
#[tokio::test]
async fn pause_everything_or_only_sends_and_resume() {
    let h = Harness::start().await;
    put(&h, P, budget(1000.0, 100), &[Q]).await;
    enqueue_n(&h, Q, 3).await;
    let running = h.claim_one(Q, "w").await;
    let reconcile = h.claim_one(Q, "w").await;
    h.client
        .clone()
        .fail(fail(&reconcile, FailDisposition::RetryReconcile, None))
        .await
        .unwrap();
    h.force_lease_expired(running.job_id).await;
    let pause = |mode: ProviderPause| PauseProviderRequest {
        name: P.into(),
        pause: mode as i32,
        operator: "alice".into(),
        reason: "provider incident".into(),
    };
    admin(&h)
        .await
        .pause_provider(pause(ProviderPause::All))
        .await
        .unwrap();
    let later = h.replica(test_config()).await;
    assert!(claim_on(&later.client, Q, 5, None).await.is_empty());
    let held = later
        .client
        .clone()
        .takeover(TakeoverRequest {
            job_id: running.job_id,
            worker_id: "w".into(),
            lease: secs(30),
        })
        .await
        .expect_err("paused");
    assert_eq!(reason(&held), "PROVIDER_PAUSED");
    admin(&h)
        .await
        .pause_provider(pause(ProviderPause::Sends))
        .await
        .unwrap();
    let got = claim_on(&later.client, Q, 5, None).await;
    let mut ids: Vec<u64> = got.iter().map(|c| c.job.as_ref().unwrap().job_id).collect();
    ids.sort();
    let mut want = vec![running.job_id, reconcile.job_id];
    want.sort();
    assert_eq!(ids, want, "the takeover and the reconcile, not the send");
    assert!(got
        .iter()
        .all(|c| c.job.as_ref().unwrap().next_action == proto::NextAction::Reconcile as i32));
    admin(&h)
        .await
        .resume_provider(ResumeProviderRequest {
            name: P.into(),
            operator: "alice".into(),
            reason: "over".into(),
        })
        .await
        .unwrap();
    let send = claim_on(&later.client, Q, 5, None).await;
    assert_eq!(send.len(), 1);
    assert_eq!(
        send[0].job.as_ref().unwrap().next_action,
        proto::NextAction::Execute as i32
    );
    h.finish().await;
}

/// An operator pauses the provider's sends (reconciles go on).
async fn pause_sends(h: &Harness) {
    admin(h)
        .await
        .pause_provider(PauseProviderRequest {
            name: P.into(),
            pause: ProviderPause::Sends as i32,
            operator: "alice".into(),
            reason: "provider incident".into(),
        })
        .await
        .unwrap();
}

/// With sends paused, a reconcile waiting behind more due sends than the
/// claim asks for is still handed out: the sends the claim's scan found
/// are held, and a second scan, of reconciles only, finds it.
#[tokio::test]
async fn a_reconcile_behind_paused_sends_is_found_past_them() {
    let h = Harness::start().await;
    put(&h, P, budget(1000.0, 100), &[Q]).await;
    enqueue_n(&h, Q, 4).await;
    let first = h.claim_one(Q, "w").await;
    h.client
        .clone()
        .fail(fail(&first, FailDisposition::RetryReconcile, None))
        .await
        .unwrap();
    pause_sends(&h).await;
    // Three sends are due before it; the claim's scan reads one of them.
    let got = h.claim(Q, "w", 1).await;
    let got: Vec<(u64, i32)> = got
        .iter()
        .map(|c| {
            let j = c.job.as_ref().unwrap();
            (j.job_id, j.next_action)
        })
        .collect();
    assert_eq!(got, [(first.job_id, proto::NextAction::Reconcile as i32)]);
    h.finish().await;
}

/// The reconciles the second scan finds fill only what the first scans
/// left of the claim's `max_jobs`. Sends paused; an expired lease (taken
/// over, a reconcile), then due in order send, send, reconcile,
/// reconcile: a claim of two gets the takeover and the first reconcile.
#[tokio::test]
async fn reconciles_found_behind_paused_sends_never_overfill_a_claim() {
    let h = Harness::start().await;
    put(&h, P, budget(1000.0, 100), &[Q]).await;
    enqueue_n(&h, Q, 5).await;
    let jobs: Vec<proto::Job> = h
        .claim(Q, "w", 5)
        .await
        .into_iter()
        .map(|c| c.job.unwrap())
        .collect();
    assert_eq!(jobs.len(), 5);
    h.force_lease_expired(jobs[0].job_id).await;
    // Failed in this order, they are due in this order.
    for (job, d) in jobs[1..].iter().zip([
        FailDisposition::RetryExecute,
        FailDisposition::RetryExecute,
        FailDisposition::RetryReconcile,
        FailDisposition::RetryReconcile,
    ]) {
        h.client.clone().fail(fail(job, d, None)).await.unwrap();
    }
    pause_sends(&h).await;
    let mut got: Vec<u64> = h
        .claim(Q, "w", 2)
        .await
        .iter()
        .map(|c| c.job.as_ref().unwrap().job_id)
        .collect();
    got.sort();
    assert_eq!(got, [jobs[0].job_id, jobs[3].job_id]);
    h.finish().await;
}

/// The cap on jobs in flight: a claim hands out only the room left (and
/// its gauge says so), a finished job makes room, an expired lease is not
/// in flight.
#[tokio::test]
async fn the_in_flight_cap_limits_what_is_handed_out() {
    let h = Harness::start().await;
    put(
        &h,
        P,
        ProviderBudget {
            max_in_flight: Some(2),
            ..budget(1000.0, 100)
        },
        &[Q],
    )
    .await;
    enqueue_n(&h, Q, 5).await;
    let got = h.claim(Q, "w", 5).await;
    assert_eq!(got.len(), 2);
    let in_flight = format!("jobfence_provider_in_flight{{provider=\"{P}\"}}");
    assert_eq!(
        metric(&h, &in_flight),
        2.0,
        "the claim reports what it put in flight"
    );
    assert!(h.claim(Q, "w", 5).await.is_empty());
    let done = got[0].job.clone().unwrap();
    h.client
        .clone()
        .complete(proto::CompleteRequest {
            job_id: done.job_id,
            attempt: done.attempt,
            provider_reference: "re_1".into(),
            result: String::new(),
            next: None,
        })
        .await
        .unwrap();
    assert_eq!(h.claim(Q, "w", 5).await.len(), 1);
    assert!(
        metric(
            &h,
            &format!("jobfence_provider_deferred_total{{cause=\"in_flight\",provider=\"{P}\"}}")
        ) >= 1.0
    );
    h.finish().await;
}

/// A cap set after a coordinator's claims of the queue found none (they
/// read the provider's rules without counting the jobs in flight) holds
/// at its very next claim: the provider's row shows the cap, and the count
/// is read under its lock before anything is handed out.
#[tokio::test]
async fn a_cap_set_after_the_last_claim_holds_at_the_next_one() {
    let h = Harness::start().await;
    put(&h, P, budget(1000.0, 100), &[Q]).await;
    enqueue_n(&h, Q, 5).await;
    let first = h.claim(Q, "w", 2).await;
    assert_eq!(first.len(), 2, "no cap yet");
    assert_eq!(h.claim(Q, "w", 1).await.len(), 1, "still no cap");
    put(
        &h,
        P,
        ProviderBudget {
            max_in_flight: Some(4),
            ..budget(1000.0, 100)
        },
        &[Q],
    )
    .await;
    let got = h.claim(Q, "w", 2).await;
    assert_eq!(got.len(), 1, "three in flight, a cap of four: room for one");
    assert!(h.claim(Q, "w", 2).await.is_empty(), "the cap is reached");
    h.finish().await;
}

/// A budget changed through one coordinator applies to the next claim on
/// another, without a restart; a queue without a provider is unlimited.
#[tokio::test]
async fn a_budget_change_applies_everywhere_without_a_restart() {
    let h = Harness::start().await;
    let replica = h.replica(test_config()).await;
    put(&h, P, budget(0.001, 1), &[Q]).await;
    enqueue_n(&h, Q, 10).await;
    enqueue_n(&h, "payouts", 10).await;
    assert_eq!(claim_on(&replica.client, Q, 5, None).await.len(), 1);
    assert!(claim_on(&replica.client, Q, 5, None).await.is_empty());
    assert_eq!(
        claim_on(&replica.client, "payouts", 10, None).await.len(),
        10
    );
    // A burst of 4 at the same slow rate: the one unit spent still
    // counts, three are there at once (the rate is so slow that the
    // milliseconds of the test add nothing).
    put(&h, P, budget(0.001, 4), &[Q]).await;
    assert_eq!(claim_on(&replica.client, Q, 9, None).await.len(), 3);
    assert!(claim_on(&replica.client, Q, 9, None).await.is_empty());
    h.finish().await;
}

/// Two queues of one provider take turns when the budget is short: the
/// queue served more recently leaves the units to the one that waited.
#[tokio::test]
async fn queues_sharing_a_provider_take_turns() {
    let h = Harness::start().await;
    put(&h, P, budget(0.001, 2), &["a", "b"]).await;
    enqueue_n(&h, "a", 10).await;
    enqueue_n(&h, "b", 10).await;
    // a takes the whole burst while b has not asked.
    assert_eq!(h.claim("a", "w", 5).await.len(), 2);
    // b asks, finds nothing left, and is now waiting.
    assert!(h.claim("b", "w", 5).await.is_empty());
    refill(&h, P).await;
    // a was served last: it leaves b one job's worth.
    assert_eq!(h.claim("a", "w", 5).await.len(), 1);
    assert_eq!(h.claim("b", "w", 5).await.len(), 1);
    refill(&h, P).await;
    // Now b was served last: a goes first, b gets the rest.
    assert_eq!(h.claim("b", "w", 5).await.len(), 1);
    assert_eq!(h.claim("a", "w", 5).await.len(), 1);
    h.finish().await;
}

/// A queue that got every job it asked for is not waiting for units: it
/// does not count as a queue the others must take turns with, so the next
/// queue of the provider may take everything left.
#[tokio::test]
async fn a_queue_served_in_full_leaves_the_others_everything() {
    let h = Harness::start().await;
    put(&h, P, budget(0.001, 10), &["a", "b"]).await;
    enqueue_n(&h, "b", 2).await;
    enqueue_n(&h, "a", 10).await;
    // b asks for 5, has only 2 due: served in full, nothing held back.
    assert_eq!(h.claim("b", "w", 5).await.len(), 2);
    // a takes the 8 units left, not half of them.
    assert_eq!(h.claim("a", "w", 10).await.len(), 8);
    h.finish().await;
}

/// A lease that ran out is taken over (as a reconcile) while another queue
/// of the same provider is paused: the claim reads whether its own queue
/// is paused, not the other one's, before it sends its expired-lease scan.
#[tokio::test]
async fn an_expired_lease_is_taken_over_beside_a_paused_queue_of_its_provider() {
    let h = Harness::start().await;
    put(&h, P, budget(1000.0, 100), &["a", "b"]).await;
    enqueue_n(&h, "a", 1).await;
    let held = h.claim_one("a", "w").await;
    admin(&h)
        .await
        .pause_queue(proto::PauseQueueRequest {
            queue: "b".into(),
            operator: "alice".into(),
            reason: "the other queue's incident".into(),
        })
        .await
        .unwrap();
    h.force_lease_expired(held.job_id).await;
    let got = h.claim("a", "w", 1).await;
    let taken: Vec<(u64, i32)> = got
        .iter()
        .map(|c| c.job.as_ref().unwrap())
        .map(|j| (j.job_id, j.next_action))
        .collect();
    assert_eq!(taken, [(held.job_id, proto::NextAction::Reconcile as i32)]);
    h.finish().await;
}

/// A queue moved to another provider while its claim waits for the old
/// provider's row (the claim looked the provider's name up before the
/// lock): the old provider's locked queues no longer hold the queue, its
/// own row names the new provider, and the claim runs again, counted,
/// under the new provider's budget (a burst of 1, not the 3 asked for).
#[tokio::test]
async fn a_queue_moved_to_another_provider_during_its_claim_is_claimed_again_under_the_new_one() {
    let h = Harness::start().await;
    put(&h, P, budget(1000.0, 100), &[Q]).await;
    put(&h, "adyen", budget(0.001, 1), &[]).await;
    enqueue_n(&h, Q, 5).await;
    assert_eq!(h.claim(Q, "w", 1).await.len(), 1, "under stripe's budget");
    let store = h.coordinator.store().clone();
    let before = store.conflicts();
    let mut holder = h.db.pool().begin().await.unwrap();
    sqlx::query("SELECT name FROM providers WHERE name = ? FOR UPDATE")
        .bind(P)
        .fetch_one(&mut *holder)
        .await
        .unwrap();
    let client = h.client.clone();
    let claim = tokio::spawn(async move { claim_on(&client, Q, 3, None).await });
    kit::until_lock_wait(&h.pool, &h.db.name).await;
    // An operator's move, in the provider-then-queue lock order.
    sqlx::query("UPDATE queue_policies SET provider = 'adyen' WHERE queue = ?")
        .bind(Q)
        .execute(&mut *holder)
        .await
        .unwrap();
    holder.commit().await.unwrap();
    let got = claim.await.unwrap();
    assert_eq!(got.len(), 1, "adyen's burst of 1: {got:?}");
    let (retried, reported) = store.conflicts();
    assert!(retried > before.0, "the claim ran again: {retried}");
    assert_eq!(reported, before.1, "no conflict reached the caller");
    assert!(
        h.claim(Q, "w", 3).await.is_empty(),
        "adyen's budget is spent"
    );
    h.finish().await;
}

/// A queue released from a provider that keeps its other queue: the
/// coordinator's next claim of it (which expected a provider) finds it
/// missing from the provider's queues, reads its own row, and hands out
/// without a budget, where the provider's spent burst would give nothing.
#[tokio::test]
async fn a_queue_released_from_a_provider_that_keeps_others_is_claimed_without_a_budget() {
    let h = Harness::start().await;
    put(&h, P, budget(0.001, 1), &["a", "b"]).await;
    enqueue_n(&h, "a", 5).await;
    assert_eq!(h.claim("a", "w", 3).await.len(), 1, "the burst of 1");
    assert!(h.claim("a", "w", 3).await.is_empty(), "the burst is spent");
    put(&h, P, budget(0.001, 1), &["b"]).await;
    let (rows,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM queue_policies WHERE queue = 'a'")
        .fetch_one(&h.db.pool())
        .await
        .unwrap();
    assert_eq!(rows, 0, "the released queue's row, left empty, is removed");
    assert_eq!(h.claim("a", "w", 3).await.len(), 3, "no provider any more");
    h.finish().await;
}

/// A claim holding its provider's rules (paused before its COMMIT) holds
/// the provider's row and its queues' rows, and no job row it did not
/// claim: the look-up inside the locking read of the earliest lease of
/// the queue's running jobs locks nothing, so a Complete of another
/// running job of the queue is never held up by it. (Locked rows answer
/// NOWAIT with a lock wait error, 1205 on MariaDB, 3572 on MySQL.)
#[tokio::test]
async fn a_claim_holding_its_providers_rules_locks_no_running_job() {
    let h = Harness::start().await;
    put(&h, P, budget(1000.0, 100), &[Q, "other"]).await;
    enqueue_n(&h, Q, 2).await;
    let running = h.claim_one(Q, "w").await;
    let mut gate = h.pauses.arm(jobfence_store::PausePoint::ClaimBeforeCommit);
    let client = h.client.clone();
    let claim = tokio::spawn(async move { claim_on(&client, Q, 1, None).await });
    gate.reached().await;
    let nowait = |sql: &'static str, bind: String| {
        let pool = h.db.pool();
        async move {
            let mut tx = pool.begin().await.unwrap();
            let got = sqlx::query(sql).bind(bind).fetch_all(&mut *tx).await;
            tx.rollback().await.unwrap();
            match got {
                Ok(_) => true,
                Err(e) => {
                    let number = e
                        .as_database_error()
                        .and_then(|d| d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
                        .map(|d| d.number());
                    assert!(matches!(number, Some(1205 | 3572)), "{e}");
                    false
                }
            }
        }
    };
    let job = "SELECT id FROM jobs WHERE id = ? FOR UPDATE NOWAIT";
    assert!(
        nowait(job, running.job_id.to_string()).await,
        "the running job is not locked by the claim"
    );
    let provider = "SELECT name FROM providers WHERE name = ? FOR UPDATE NOWAIT";
    assert!(!nowait(provider, P.into()).await, "the provider's row is");
    let queue = "SELECT queue FROM queue_policies WHERE queue = ? FOR UPDATE NOWAIT";
    assert!(!nowait(queue, "other".into()).await, "and its queues' rows");
    gate.release();
    assert_eq!(claim.await.unwrap().len(), 1);
    h.finish().await;
}

/// Bad budgets and assignments are refused with a field violation each,
/// and nothing is written.
#[tokio::test]
async fn bad_budget_input_is_refused_field_by_field_and_writes_nothing() {
    let h = Harness::start().await;
    put(&h, P, budget(10.0, 5), &[Q]).await;
    let counts = || async {
        let row = sqlx::query(
            "SELECT (SELECT COUNT(*) FROM providers) AS p, (SELECT COUNT(*) FROM queue_policies) AS q, \
             (SELECT COUNT(*) FROM policy_changes) AS c, (SELECT CAST(rate_per_second AS CHAR) FROM providers WHERE name = 'stripe') AS r",
        )
        .fetch_one(&h.pool)
        .await
        .unwrap();
        (
            row.get::<i64, _>("p"),
            row.get::<i64, _>("q"),
            row.get::<i64, _>("c"),
            row.get::<String, _>("r"),
        )
    };
    let before = counts().await;
    let cases: Vec<(ProviderBudget, Vec<&str>, &str, &str)> = vec![
        (budget(-1.0, 5), vec![], "adyen", "budget.rate_per_second"),
        (
            budget(f64::NAN, 5),
            vec![],
            "adyen",
            "budget.rate_per_second",
        ),
        (
            budget(f64::INFINITY, 5),
            vec![],
            "adyen",
            "budget.rate_per_second",
        ),
        (budget(10.0, 0), vec![], "adyen", "budget.burst"),
        (
            ProviderBudget {
                execute_cost: Some(0),
                ..budget(10.0, 5)
            },
            vec![],
            "adyen",
            "budget.execute_cost",
        ),
        (
            ProviderBudget {
                reconcile_cost: Some(0),
                ..budget(10.0, 5)
            },
            vec![],
            "adyen",
            "budget.reconcile_cost",
        ),
        (budget(10.0, 5), vec![Q], "adyen", "queues[0]"),
        (budget(10.0, 5), vec!["x", "x"], "adyen", "queues[1]"),
        (budget(10.0, 5), vec![], "bad name", "name"),
        (budget(-3.0, 5), vec![Q], P, "budget.rate_per_second"),
    ];
    for (b, queues, name, field) in cases {
        let status = admin(&h)
            .await
            .put_provider(PutProviderRequest {
                name: name.into(),
                budget: Some(b),
                queues: queues.iter().map(|q| q.to_string()).collect(),
                operator: "alice".into(),
                reason: "typo".into(),
            })
            .await
            .expect_err(field);
        assert_eq!(status.code(), Code::InvalidArgument, "{field}");
        assert_eq!(reason(&status), "INVALID_REQUEST");
        let fields: Vec<String> = status
            .get_details_bad_request()
            .unwrap()
            .field_violations
            .into_iter()
            .map(|v| v.field)
            .collect();
        assert!(fields.contains(&field.to_string()), "{field}: {fields:?}");
    }
    let unknown = admin(&h)
        .await
        .pause_provider(PauseProviderRequest {
            name: "nobody".into(),
            pause: ProviderPause::All as i32,
            operator: "alice".into(),
            reason: "typo".into(),
        })
        .await
        .expect_err("unknown provider");
    assert_eq!(unknown.code(), Code::InvalidArgument);
    assert_eq!(
        unknown.get_details_bad_request().unwrap().field_violations[0].field,
        "name"
    );
    assert_eq!(counts().await, before, "nothing written");
    h.finish().await;
}

/// Two coordinators with different flags decide a resend alike once the
/// queue's policy is stored, and the one whose flags differ says so.
#[tokio::test]
async fn a_stored_policy_wins_over_every_coordinators_flags() {
    let h = Harness::start().await;
    let mut other = test_config();
    other.policies.default.resend_window = Duration::from_secs(60);
    let replica = h.replica(other).await;
    admin(&h)
        .await
        .put_queue_policy(PutQueuePolicyRequest {
            queue: Q.into(),
            resend_window: secs(3600),
            max_dispatches: Some(3),
            job_retention: None,
            operator: "alice".into(),
            reason: "one truth".into(),
        })
        .await
        .unwrap();
    let job = h.enqueue(Q, "refund-1", "{}").await;
    let a = h.claim_one(Q, "w").await;
    sqlx::query("UPDATE jobs SET first_dispatched_at = DATE_SUB(UTC_TIMESTAMP(6), INTERVAL 30 MINUTE) WHERE id = ?")
        .bind(job.job_id)
        .execute(&h.pool)
        .await
        .unwrap();
    // Through the coordinator whose flag says 1 min: the stored 1 h decides.
    let out = replica
        .client
        .clone()
        .fail(fail(&a, FailDisposition::RetryExecute, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(out.applied, FailDisposition::RetryExecute as i32);
    assert_eq!(
        replica
            .coordinator
            .warn_flags_differ_from_stored()
            .await
            .unwrap(),
        vec![Q.to_string()]
    );
    assert!(h.coordinator.warn_flags_differ_from_stored().await.unwrap() == vec![Q.to_string()]);
    h.finish().await;
}

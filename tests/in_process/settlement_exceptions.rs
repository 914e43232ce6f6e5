//! An operator's action on a settlement exception (docs/design.md rule
//! 15), over gRPC: the refusals a client switches on. Two operators saw the
//! same open exception; the second to act is refused as
//! SETTLEMENT_EXCEPTION_MOVED with the state it is in now, and nothing of
//! the refused action is recorded. An id no database holds is
//! SETTLEMENT_EXCEPTION_NOT_FOUND, for a read and for an action. An
//! action behind a row lock is run again, counted, and recorded once; a
//! locked exception holds up no report deciding another subject.

use crate::settlement::{import, line, provider, succeeded, P};
use jobfence_api::v1::job_admin_client::JobAdminClient;
use jobfence_api::v1::{ActOnSettlementExceptionRequest, ListSettlementExceptionsRequest};
use jobfence_testkit as kit;
use kit::{meta, reason, Harness};
use tonic::Code;

fn act(id: u64, seen: &str, to: &str, operator: &str) -> ActOnSettlementExceptionRequest {
    ActOnSettlementExceptionRequest {
        id,
        seen_state: seen.into(),
        to_state: to.into(),
        operator: operator.into(),
        note: format!("{operator} looked at the provider's dashboard"),
    }
}

async fn actions(h: &Harness, id: u64) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT CAST(action AS CHAR), CAST(operator AS CHAR) FROM settlement_exception_actions \
         WHERE exception_id = ? ORDER BY id",
    )
    .bind(id)
    .fetch_all(&h.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn the_second_operator_to_act_is_refused_as_moved_and_an_unknown_id_as_not_found() {
    let h = Harness::start().await;
    provider(&h).await;
    // A refund nobody enqueued: one UNKNOWN_REFERENCE exception, open.
    import(
        &h,
        &[line(1, "re_by_hand", "made-by-hand", 500, "succeeded")],
    )
    .await;
    let mut admin = JobAdminClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap();
    let listed = admin
        .list_settlement_exceptions(ListSettlementExceptionsRequest {
            provider: P.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .exceptions;
    assert_eq!(listed.len(), 1, "{listed:?}");
    let id = listed[0].id;

    // alice and bob both saw it open; alice acknowledges it first.
    let acked = admin
        .act_on_settlement_exception(act(id, "open", "acknowledged", "alice"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(acked.exception.unwrap().state, "acknowledged");
    let refused = admin
        .act_on_settlement_exception(act(id, "open", "resolved", "bob"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert_eq!(reason(&refused), "SETTLEMENT_EXCEPTION_MOVED");
    assert_eq!(meta(&refused, "exception_id"), id.to_string());
    assert_eq!(meta(&refused, "seen_state"), "open");
    assert_eq!(meta(&refused, "current_state"), "acknowledged");
    assert_eq!(
        actions(&h, id).await,
        [
            ("opened".to_owned(), "settlement".to_owned()),
            ("acknowledged".to_owned(), "alice".to_owned())
        ],
        "bob's refused action is not recorded"
    );

    // Acting on what is there now goes through.
    admin
        .act_on_settlement_exception(act(id, "acknowledged", "resolved", "bob"))
        .await
        .unwrap();
    // A resolved one stays so: said as such, not as a state to go to.
    let after = admin
        .act_on_settlement_exception(act(id, "resolved", "acknowledged", "alice"))
        .await
        .unwrap_err();
    assert_eq!(after.code(), Code::InvalidArgument, "{after:?}");
    assert!(after.message().contains("resolved already"), "{after:?}");

    let missing = id + 1000;
    let unknown = admin
        .act_on_settlement_exception(act(missing, "open", "acknowledged", "alice"))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound, "{unknown:?}");
    assert_eq!(reason(&unknown), "SETTLEMENT_EXCEPTION_NOT_FOUND");
    assert_eq!(meta(&unknown, "exception_id"), missing.to_string());
    assert!(actions(&h, missing).await.is_empty());
    let read = admin
        .list_settlement_exceptions(ListSettlementExceptionsRequest {
            id: missing,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(read.code(), Code::NotFound, "{read:?}");
    assert_eq!(reason(&read), "SETTLEMENT_EXCEPTION_NOT_FOUND");
    h.finish().await;
}

/// An operator's action behind another transaction's lock on the
/// exception's row (the default MariaDB, lock waits of 1 s) times out, is
/// run again and counted, and lands once the row is free, recorded once.
#[tokio::test]
async fn an_action_behind_a_row_lock_is_run_again_counted_and_recorded_once() {
    let h = Harness::start_with_lock_wait(1).await;
    provider(&h).await;
    import(
        &h,
        &[line(1, "re_by_hand", "made-by-hand", 500, "succeeded")],
    )
    .await;
    let id: u64 = sqlx::query_scalar("SELECT id FROM settlement_exceptions")
        .fetch_one(&h.pool)
        .await
        .unwrap();
    let mut holder = h.db.pool().begin().await.unwrap();
    sqlx::query("SELECT id FROM settlement_exceptions WHERE id = ? FOR UPDATE")
        .bind(id)
        .fetch_one(&mut *holder)
        .await
        .unwrap();
    let store = h.coordinator.store().clone();
    let before = store.conflicts();
    let mut admin = JobAdminClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap();
    let acting = tokio::spawn(async move {
        admin
            .act_on_settlement_exception(act(id, "open", "acknowledged", "alice"))
            .await
    });
    kit::until("the action's lock wait timed out and was run again", || {
        store.conflicts().0 > before.0
    })
    .await;
    holder.rollback().await.unwrap();
    let done = acting.await.unwrap().expect("applied after its conflict");
    assert_eq!(done.into_inner().exception.unwrap().state, "acknowledged");
    let (retried, reported) = store.conflicts();
    assert!(retried > before.0, "retried {retried}");
    assert_eq!(reported, before.1, "no conflict reached the caller");
    assert_eq!(
        actions(&h, id).await,
        [
            ("opened".to_owned(), "settlement".to_owned()),
            ("acknowledged".to_owned(), "alice".to_owned())
        ]
    );
    h.finish().await;
}

/// A report deciding one subject does not wait for another subject's
/// exception held by another transaction (an operator's action, an import
/// raising on another key): the locking read of a subject's exceptions
/// reads that subject's rows only (`ix_settlement_exceptions_subject`,
/// migration 20261212000001). Without the index it read every exception
/// of the provider, met the held row and waited. Among 200 exceptions of
/// the provider one is locked; an import raising a double refund of
/// another key lands with no lock wait (waits of 1 s here, so one would
/// be counted as a conflict).
#[tokio::test]
async fn a_locked_exception_holds_up_no_decision_of_another_subject() {
    let h = Harness::start_with_lock_wait(1).await;
    provider(&h).await;
    let by_hand: Vec<_> = (0..200)
        .map(|i| {
            let (reference, key) = (format!("re_hand_{i}"), format!("by-hand-{i}"));
            line(i + 1, &reference, &key, 500, "succeeded")
        })
        .collect();
    let first = import(&h, &by_hand).await;
    assert_eq!(first.decided.exceptions_opened, 200, "{first:?}");
    let mut holder = h.db.pool().begin().await.unwrap();
    sqlx::query("SELECT id FROM settlement_exceptions WHERE subject = 'by-hand-7' FOR UPDATE")
        .fetch_one(&mut *holder)
        .await
        .unwrap();
    succeeded(&h, "refund-twice", 500).await;
    let store = h.coordinator.store().clone();
    let before = store.conflicts();
    let twice = import(
        &h,
        &[
            line(1, "re_t1", "refund-twice", 500, "succeeded"),
            line(2, "re_t2", "refund-twice", 500, "succeeded"),
        ],
    )
    .await;
    assert_eq!(twice.decided.exceptions_opened, 1, "{twice:?}");
    assert_eq!(
        store.conflicts(),
        before,
        "the double refund was raised without waiting for by-hand-7's row"
    );
    holder.rollback().await.unwrap();
    h.finish().await;
}

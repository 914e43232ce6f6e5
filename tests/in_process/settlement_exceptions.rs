//! An operator's action on a settlement exception (docs/design.md rule
//! 15), over gRPC: the refusals a client switches on. Two operators saw the
//! same open exception; the second to act is refused as
//! SETTLEMENT_EXCEPTION_MOVED with the state it is in now, and nothing of
//! the refused action is recorded. An id no database holds is
//! SETTLEMENT_EXCEPTION_NOT_FOUND, for a read and for an action.

use crate::settlement::{import, line, provider, P};
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
    let mut h = Harness::start().await;
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
    h.stop().await;
}

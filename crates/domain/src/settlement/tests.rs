use super::*;

fn line(reference: &str, status: LineStatus, amount: i64) -> SettlementLine {
    SettlementLine {
        provider_reference: reference.into(),
        operation_key: Some("refund-1".into()),
        amount_minor: amount,
        currency: "USD".into(),
        status,
        created_at: DbTime::default(),
    }
}

fn job(state: JobState, amount: Option<i64>) -> Holder {
    Holder::Job {
        id: 7,
        state,
        attempt: 3,
        amount: amount.map(|a| (a, "USD".to_owned())),
    }
}

fn kinds(d: &Decision) -> Vec<ExceptionKind> {
    d.exceptions.iter().map(|(k, _)| *k).collect()
}

#[test]
fn one_settled_refund_of_a_succeeded_job_matches() {
    let d = decide(
        &job(JobState::Succeeded, Some(500)),
        &[line("re_1", LineStatus::Succeeded, 500)],
    );
    assert_eq!(d.outcome, Outcome::Matched);
    assert!(d.exceptions.is_empty());
}

#[test]
fn pending_failed_and_cancelled_lines_decide_nothing() {
    for status in [
        LineStatus::Pending,
        LineStatus::Failed,
        LineStatus::Canceled,
    ] {
        let d = decide(
            &job(JobState::ManualReview, None),
            &[line("re_1", status, 500)],
        );
        assert_eq!(d.outcome, Outcome::Undecided, "{status:?}");
        let d = decide(&Holder::Nobody, &[line("re_1", status, 500)]);
        assert_eq!(d.outcome, Outcome::Undecided, "{status:?}");
    }
}

#[test]
fn two_settled_refunds_of_one_key_are_a_double_refund() {
    let lines = [
        line("re_1", LineStatus::Succeeded, 500),
        line("re_2", LineStatus::Succeeded, 500),
        line("re_3", LineStatus::Failed, 500),
    ];
    let d = decide(&job(JobState::Succeeded, None), &lines);
    assert_eq!(d.outcome, Outcome::Exception);
    assert_eq!(kinds(&d), [ExceptionKind::DoubleRefund]);
    assert!(d.exceptions[0].1.contains("re_1, re_2"), "{d:?}");
    // Also of a job in manual review: not resolved on a double refund.
    let d = decide(&job(JobState::ManualReview, None), &lines[..2]);
    assert_eq!(kinds(&d), [ExceptionKind::DoubleRefund]);
}

#[test]
fn a_refund_of_a_failed_or_cancelled_job_is_not_recorded() {
    for state in [JobState::Failed, JobState::Cancelled] {
        let d = decide(&job(state, None), &[line("re_1", LineStatus::Succeeded, 1)]);
        assert_eq!(kinds(&d), [ExceptionKind::RefundNotRecorded], "{state:?}");
        let pruned = Holder::Pruned {
            job_id: 9,
            final_state: state,
        };
        let d = decide(&pruned, &[line("re_1", LineStatus::Succeeded, 1)]);
        assert_eq!(kinds(&d), [ExceptionKind::RefundNotRecorded], "{state:?}");
    }
}

#[test]
fn a_manual_review_is_resolved_and_a_live_job_only_observed() {
    let d = decide(
        &job(JobState::ManualReview, None),
        &[line("re_1", LineStatus::Succeeded, 1)],
    );
    assert_eq!(
        d.outcome,
        Outcome::Resolve {
            job_id: 7,
            attempt: 3,
            provider_reference: "re_1".into()
        }
    );
    for state in [JobState::Ready, JobState::Running] {
        let d = decide(&job(state, None), &[line("re_1", LineStatus::Succeeded, 1)]);
        assert_eq!(d.outcome, Outcome::Observe { job_id: 7 });
    }
}

#[test]
fn amounts_are_compared_only_when_the_job_has_one() {
    let lines = [line("re_1", LineStatus::Succeeded, 499)];
    let d = decide(&job(JobState::Succeeded, Some(500)), &lines);
    assert_eq!(d.outcome, Outcome::Matched);
    assert_eq!(kinds(&d), [ExceptionKind::AmountMismatch]);
    let d = decide(&job(JobState::Succeeded, None), &lines);
    assert!(d.exceptions.is_empty());
    let pruned = Holder::Pruned {
        job_id: 9,
        final_state: JobState::Succeeded,
    };
    assert_eq!(decide(&pruned, &lines).outcome, Outcome::Matched);
}

#[test]
fn a_settled_refund_nobody_enqueued_is_an_unknown_reference() {
    let d = decide(&Holder::Nobody, &[line("re_9", LineStatus::Succeeded, 1)]);
    assert_eq!(kinds(&d), [ExceptionKind::UnknownReference]);
    assert_eq!(
        ExceptionKind::UnknownReference.severity(),
        Severity::Warning
    );
    assert_eq!(ExceptionKind::DoubleRefund.severity(), Severity::Critical);
}

#[test]
fn a_first_line_is_decided_on_insert_only_when_it_writes_nothing_more() {
    let settled = line("re_1", LineStatus::Succeeded, 500);
    let on = |h: &Holder, l: &SettlementLine| on_insert(h, l);
    assert_eq!(
        on(&job(JobState::Succeeded, Some(500)), &settled),
        Some(Outcome::Matched)
    );
    assert_eq!(
        on(&job(JobState::Succeeded, None), &settled),
        Some(Outcome::Matched)
    );
    let pruned = Holder::Pruned {
        job_id: 9,
        final_state: JobState::Succeeded,
    };
    assert_eq!(on(&pruned, &settled), Some(Outcome::Matched));
    for status in [
        LineStatus::Pending,
        LineStatus::Failed,
        LineStatus::Canceled,
    ] {
        let l = line("re_1", status, 500);
        assert_eq!(on(&Holder::Nobody, &l), Some(Outcome::Undecided));
        assert_eq!(
            on(&job(JobState::ManualReview, None), &l),
            Some(Outcome::Undecided)
        );
    }
    // A match whose amounts differ raises an exception: left undecided.
    assert_eq!(on(&job(JobState::Succeeded, Some(499)), &settled), None);
    // A resolution, an observation or an exception: left undecided.
    for state in [
        JobState::ManualReview,
        JobState::Ready,
        JobState::Running,
        JobState::Failed,
        JobState::Cancelled,
    ] {
        assert_eq!(on(&job(state, None), &settled), None, "{state:?}");
    }
    assert_eq!(on(&Holder::Nobody, &settled), None);
}

#[test]
fn a_holder_names_its_job_pruned_or_not() {
    assert_eq!(job(JobState::Ready, None).job_id(), Some(7));
    let pruned = Holder::Pruned {
        job_id: 9,
        final_state: JobState::Succeeded,
    };
    assert_eq!(pruned.job_id(), Some(9));
    assert_eq!(Holder::Nobody.job_id(), None);
}

#[test]
fn missing_at_provider_is_cleared_only_once_a_refund_settled() {
    let pending = [line("re_1", LineStatus::Pending, 500)];
    let cleared = clearable(&pending);
    assert!(!cleared.contains(&ExceptionKind::MissingAtProvider));
    assert_eq!(cleared.len(), ExceptionKind::ALL.len() - 1);
    let settled = [pending[0].clone(), line("re_2", LineStatus::Succeeded, 500)];
    let mut cleared = clearable(&settled);
    cleared.sort();
    assert_eq!(cleared, ExceptionKind::ALL);
}

#[test]
fn a_tally_counts_each_outcome_and_adds_up() {
    let resolve = Outcome::Resolve {
        job_id: 7,
        attempt: 3,
        provider_reference: "re_1".into(),
    };
    let mut t = records::Tally::counted(&[
        Outcome::Matched,
        Outcome::Matched,
        resolve,
        Outcome::Observe { job_id: 8 },
        Outcome::Undecided,
        Outcome::Exception,
    ]);
    assert_eq!(
        t,
        records::Tally {
            matched: 2,
            resolved: vec![(7, "re_1".into())],
            observed: 1,
            undecided: 1,
            ..Default::default()
        }
    );
    let more = records::Tally {
        matched: 1,
        resolved: vec![(9, "re_9".into())],
        exceptions_opened: 2,
        exceptions_resolved: 1,
        ..Default::default()
    };
    t.add(&more);
    assert_eq!(t.matched, 3);
    assert_eq!(t.resolved, [(7, "re_1".into()), (9, "re_9".into())]);
    assert_eq!((t.exceptions_opened, t.exceptions_resolved), (2, 1));
}

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

/// The provider's one queue, its amounts at `/amount` and `/currency`.
fn queues() -> Vec<records::QueueAmounts> {
    vec![records::QueueAmounts {
        queue: "refunds".into(),
        amount_pointer: Some("/amount".into()),
        currency_pointer: Some("/currency".into()),
    }]
}

/// `h` as the store reads it, of queue `refunds`: a job's amount in its
/// payload.
fn held_of(h: &Holder) -> held::Held {
    let payload = match h {
        Holder::Job {
            amount: Some((a, c)),
            ..
        } => Some(format!("{{\"amount\": {a}, \"currency\": \"{c}\"}}")),
        _ => None,
    };
    held::Held {
        holder: h.clone(),
        queue: Some("refunds".into()),
        payload,
        provider_reference: None,
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
    assert!(d.exceptions[0].1.contains("names no operation"), "{d:?}");
}

#[test]
fn a_keyless_refund_nobody_recorded_says_its_reference_was_looked_up_too() {
    let keyless = SettlementLine {
        operation_key: None,
        ..line("re_9", LineStatus::Succeeded, 1)
    };
    let d = decide(&Holder::Nobody, &[keyless]);
    assert_eq!(kinds(&d), [ExceptionKind::UnknownReference]);
    assert!(
        d.exceptions[0]
            .1
            .starts_with("refund re_9 gives no operation key, and no job"),
        "{d:?}"
    );
}

#[test]
fn a_first_line_is_decided_on_insert_only_when_it_writes_nothing_more() {
    let settled = line("re_1", LineStatus::Succeeded, 500);
    let on = |h: &Holder, l: &SettlementLine| match h {
        Holder::Nobody => on_insert(&queues(), &[], l),
        h => on_insert(&queues(), &[held_of(h)], l),
    };
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
    assert!(cleared.contains(&ExceptionKind::AmbiguousKey));
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

/// A job of queue `queue`, id `id`, in `state`, that recorded `reference`.
fn job_in(queue: &str, id: u64, state: JobState, reference: Option<&str>) -> held::Held {
    held::Held {
        holder: Holder::Job {
            id,
            state,
            attempt: 1,
            amount: None,
        },
        queue: Some(queue.into()),
        payload: None,
        provider_reference: reference.map(str::to_owned),
    }
}

fn decided(held: &[held::Held], lines: &[SettlementLine]) -> (Option<u64>, Decision) {
    let (h, d) = held::decide_held(&queues(), held, lines);
    (h.job_id(), d)
}

/// A key in two of the provider's queues is decided against the job that
/// recorded the settled refund's reference, though an older job holds it
/// too: the manual review of the other is not resolved by its refund.
#[test]
fn of_two_queues_the_job_that_recorded_the_reference_holds_the_key() {
    let settled = [line("re_1", LineStatus::Succeeded, 500)];
    let held = [
        job_in("refunds", 3, JobState::ManualReview, None),
        job_in("refunds-eu", 7, JobState::Succeeded, Some("re_1")),
    ];
    let (job, d) = decided(&held, &settled);
    assert_eq!((job, &d.outcome), (Some(7), &Outcome::Matched));
    assert!(d.exceptions.is_empty());
    // Its exceptions name both queues.
    let held = [
        job_in("refunds", 3, JobState::Succeeded, None),
        job_in("refunds-eu", 7, JobState::Failed, Some("re_1")),
    ];
    let (job, d) = decided(&held, &settled);
    assert_eq!(
        (job, kinds(&d)),
        (Some(7), vec![ExceptionKind::RefundNotRecorded])
    );
    let detail = &d.exceptions[0].1;
    for named in [
        "job 3 of queue refunds (succeeded)",
        "job 7 of queue refunds-eu (failed)",
    ] {
        assert!(detail.contains(named), "{detail}");
    }
}

/// When no single job recorded the reference, the decision stands only
/// where every holder gives the same; otherwise the key is ambiguous,
/// named by queue, and nothing is resolved or observed.
#[test]
fn a_key_no_single_job_recorded_is_decided_only_where_its_jobs_agree() {
    let settled = [line("re_1", LineStatus::Succeeded, 500)];
    let both_parked = [
        job_in("refunds", 3, JobState::ManualReview, None),
        job_in("refunds-eu", 7, JobState::ManualReview, None),
    ];
    let (job, d) = decided(&both_parked, &settled);
    assert_eq!((job, &d.outcome), (Some(3), &Outcome::Exception));
    assert_eq!(kinds(&d), [ExceptionKind::AmbiguousKey]);
    assert_eq!(ExceptionKind::AmbiguousKey.severity(), Severity::Warning);
    let detail = &d.exceptions[0].1;
    assert!(detail.contains("re_1"), "{detail}");
    for named in [
        "queue refunds (manual_review)",
        "queue refunds-eu (manual_review)",
    ] {
        assert!(detail.contains(named), "{detail}");
    }
    // Both recorded it (the provider answered both sends with one refund)
    // and both succeeded: matched.
    let both_done = [
        job_in("refunds", 3, JobState::Succeeded, Some("re_1")),
        job_in("refunds-eu", 7, JobState::Succeeded, Some("re_1")),
    ];
    let (_, d) = decided(&both_done, &settled);
    assert_eq!((d.outcome, d.exceptions.len()), (Outcome::Matched, 0));
    // Both failed: money moved that jobfence says did not, whichever.
    let both_failed = [
        job_in("refunds", 3, JobState::Failed, None),
        job_in("refunds-eu", 7, JobState::Cancelled, None),
    ];
    let (_, d) = decided(&both_failed, &settled);
    assert_eq!(kinds(&d), [ExceptionKind::RefundNotRecorded]);
    // One succeeded, one failed: which is it?
    let split = [
        job_in("refunds", 3, JobState::Succeeded, None),
        job_in("refunds-eu", 7, JobState::Failed, None),
    ];
    assert_eq!(
        kinds(&decided(&split, &settled).1),
        [ExceptionKind::AmbiguousKey]
    );
    // Nothing settled decides nothing, however many hold the key.
    let pending = [line("re_1", LineStatus::Pending, 500)];
    assert_eq!(decided(&split, &pending).1.outcome, Outcome::Undecided);
    // Not decided on insert unless it writes nothing.
    assert_eq!(on_insert(&queues(), &both_parked, &settled[0]), None);
    assert_eq!(
        on_insert(&queues(), &both_done, &settled[0]),
        Some(Outcome::Matched)
    );
}

#[test]
fn a_key_one_job_holds_is_decided_against_it_and_nobody_is_unknown() {
    let settled = [line("re_1", LineStatus::Succeeded, 500)];
    let (job, d) = decided(
        &[job_in("refunds", 3, JobState::ManualReview, None)],
        &settled,
    );
    assert_eq!(job, Some(3));
    assert!(
        matches!(d.outcome, Outcome::Resolve { job_id: 3, .. }),
        "{d:?}"
    );
    let (job, d) = decided(&[], &settled);
    assert_eq!(
        (job, kinds(&d)),
        (None, vec![ExceptionKind::UnknownReference])
    );
}

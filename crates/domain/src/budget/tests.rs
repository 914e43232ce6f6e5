//! Unit tests of the budget's arithmetic: GCRA, fair share, allowance.

use super::*;

fn t(s: &str) -> DbTime {
    DbTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f").unwrap()
}

fn budget(rate: f64, burst: u32) -> Budget {
    Budget {
        rate_per_second: rate,
        burst,
        max_in_flight: None,
        execute_cost: 1,
        reconcile_cost: 1,
        per_key: Default::default(),
    }
}

const NOW: &str = "2026-12-01 12:00:00";

#[test]
fn an_idle_budget_offers_its_whole_burst() {
    let b = budget(10.0, 5);
    let g = Gcra::at(&b, t("2026-12-01 11:00:00"), t(NOW));
    assert_eq!(g.available(), 5);
    assert_eq!(g.due_in(1), Duration::ZERO);
}

#[test]
fn spending_moves_the_arrival_time_by_the_interval() {
    let b = budget(10.0, 5);
    let now = t(NOW);
    let g = Gcra::at(&b, now, now);
    assert_eq!(g.available(), 5);
    let tat = g.spend(now, 5);
    assert_eq!(tat, t("2026-12-01 12:00:00.5"));
    let g = Gcra::at(&b, tat, now);
    assert_eq!(g.available(), 0);
    assert_eq!(g.due_in(1), Duration::from_millis(100));
    // 100 ms later one unit is due again, and only one.
    let later = t("2026-12-01 12:00:00.1");
    assert_eq!(Gcra::at(&b, tat, later).available(), 1);
    assert_eq!(
        Gcra::at(&b, tat, t("2026-12-01 12:00:00.099")).available(),
        0
    );
}

#[test]
fn fractional_rates_space_units_out() {
    let b = budget(0.5, 1);
    let now = t(NOW);
    let tat = Gcra::at(&b, now, now).spend(now, 1);
    assert_eq!(tat, t("2026-12-01 12:00:02"));
    let g = Gcra::at(&b, tat, t("2026-12-01 12:00:01"));
    assert_eq!(g.available(), 0);
    assert_eq!(g.due_in(1), Duration::from_secs(1));
}

#[test]
fn a_costly_hand_out_waits_for_its_units() {
    let b = Budget {
        reconcile_cost: 2,
        ..budget(10.0, 2)
    };
    let now = t(NOW);
    let g = Gcra::at(&b, t("2026-12-01 12:00:00.1"), now);
    assert_eq!(g.available(), 1);
    assert_eq!(g.due_in(2), Duration::from_millis(100));
    assert_eq!(b.cost(NextAction::Reconcile), 2);
}

/// Over any window, what GCRA lets through stays within
/// `burst + window × rate`, whatever the pattern of requests.
#[test]
fn any_window_stays_within_rate_times_window_plus_burst() {
    let b = budget(7.0, 3);
    let start = t(NOW);
    let mut tat = start;
    let mut grants: Vec<i64> = Vec::new();
    // A claim every 13 ms asking for 4 jobs, for 3 s.
    for step in 0..230 {
        let now = start + chrono::TimeDelta::milliseconds(step * 13);
        let g = Gcra::at(&b, tat, now);
        let n = g.available().min(4);
        if n > 0 {
            tat = g.spend(now, n);
            for _ in 0..n {
                grants.push(step * 13);
            }
        }
    }
    for w in [100_i64, 500, 1000, 2000] {
        let limit = 3.0 + 7.0 * (w as f64) / 1000.0;
        let worst = grants
            .iter()
            .map(|&s| grants.iter().filter(|&&g| g >= s && g < s + w).count())
            .max()
            .unwrap();
        assert!(
            worst as f64 <= limit,
            "{worst} hand-outs in a {w} ms window, limit {limit}"
        );
    }
    // And it does hand out about the rate.
    assert!(
        grants.len() >= 20 && grants.len() <= 3 + 7 * 3 + 1,
        "{}",
        grants.len()
    );
}

#[test]
fn bad_budgets_are_named_field_by_field() {
    let fields = |b: Budget| -> Vec<String> {
        b.violations("budget.")
            .into_iter()
            .map(|v| v.field)
            .collect()
    };
    assert!(fields(budget(10.0, 5)).is_empty());
    assert_eq!(fields(budget(-1.0, 5)), ["budget.rate_per_second"]);
    assert_eq!(fields(budget(f64::NAN, 5)), ["budget.rate_per_second"]);
    assert_eq!(fields(budget(f64::INFINITY, 5)), ["budget.rate_per_second"]);
    assert_eq!(fields(budget(0.0, 5)), ["budget.rate_per_second"]);
    assert_eq!(fields(budget(1.0, 0)), ["budget.burst"]);
    assert_eq!(
        fields(Budget {
            execute_cost: 0,
            ..budget(1.0, 1)
        }),
        ["budget.execute_cost"]
    );
    assert_eq!(
        fields(Budget {
            reconcile_cost: 3,
            ..budget(1.0, 2)
        }),
        ["budget.burst"]
    );
    assert_eq!(
        fields(Budget {
            max_in_flight: Some(0),
            ..budget(1.0, 2)
        }),
        ["budget.max_in_flight"]
    );
}

#[test]
fn the_allowance_says_why_a_job_waits() {
    let mut a = Allowance {
        units: 3,
        in_flight_room: Some(2),
        pause: Pause::Sends,
        throttled: false,
        shared: false,
        spent: 0,
        per_key: None,
    };
    assert_eq!(a.take(NextAction::Execute, 1), Err(Holdback::Paused));
    assert_eq!(a.take(NextAction::Reconcile, 2), Ok(()));
    assert_eq!(a.take(NextAction::Reconcile, 2), Err(Holdback::Rate));
    assert_eq!(a.take(NextAction::Reconcile, 1), Ok(()));
    assert_eq!(a.spent, 3);
    let mut full = Allowance {
        units: 10,
        in_flight_room: Some(0),
        ..Allowance::unlimited()
    };
    assert_eq!(full.take(NextAction::Reconcile, 1), Err(Holdback::InFlight));
    let mut throttled = Allowance {
        throttled: true,
        ..Allowance::unlimited()
    };
    assert_eq!(
        throttled.take(NextAction::Reconcile, 1),
        Err(Holdback::Throttled)
    );
    let mut all = Allowance {
        pause: Pause::All,
        ..Allowance::unlimited()
    };
    assert_eq!(all.take(NextAction::Reconcile, 1), Err(Holdback::Paused));
}

fn share(queue: &str, granted: Option<&str>, short: Option<&str>) -> QueueShare {
    QueueShare {
        queue: queue.into(),
        last_granted_at: granted.map(t),
        last_short_at: short.map(t),
    }
}

#[test]
fn a_queue_alone_takes_everything() {
    let b = budget(10.0, 10);
    let shares = [
        share("a", Some("2026-12-01 11:59:59.9"), Some(NOW)),
        // b was cut short long ago: its workers left.
        share("b", None, Some("2026-12-01 11:00:00")),
    ];
    assert_eq!(fair_share("a", 10, &shares, &b, t(NOW)), 10);
}

#[test]
fn two_waiting_queues_take_turns() {
    let b = budget(10.0, 10);
    let now = t(NOW);
    // a was served more recently than b: with one unit left, b gets it.
    let shares = [
        share("a", Some("2026-12-01 11:59:59.9"), Some(NOW)),
        share("b", Some("2026-12-01 11:59:59.5"), Some(NOW)),
    ];
    assert_eq!(fair_share("a", 1, &shares, &b, now), 0);
    assert_eq!(fair_share("b", 1, &shares, &b, now), 1);
    // With ten, each takes half: b first (5 of 10), then a.
    assert_eq!(fair_share("b", 10, &shares, &b, now), 5);
    assert_eq!(fair_share("a", 10, &shares, &b, now), 5);
    // Never served yet beats served.
    let fresh = [
        share("a", Some("2026-12-01 11:59:59.9"), Some(NOW)),
        share("b", None, Some(NOW)),
    ];
    assert_eq!(fair_share("a", 1, &fresh, &b, now), 0);
    assert_eq!(fair_share("b", 1, &fresh, &b, now), 1);
    // Neither served: the name decides, and exactly one may take it.
    let neither = [share("a", None, Some(NOW)), share("b", None, Some(NOW))];
    assert_eq!(
        fair_share("a", 1, &neither, &b, now) + fair_share("b", 1, &neither, &b, now),
        1
    );
}

#[test]
fn a_share_is_never_smaller_than_one_job() {
    let b = Budget {
        reconcile_cost: 2,
        ..budget(10.0, 2)
    };
    let now = t(NOW);
    let shares = [
        share("a", Some("2026-12-01 11:59:59.5"), Some(NOW)),
        share("b", Some("2026-12-01 11:59:59.9"), Some(NOW)),
    ];
    // Two units, two queues: a (served longest ago) may take a whole
    // reconcile instead of both getting one useless unit.
    assert_eq!(fair_share("a", 2, &shares, &b, now), 2);
    assert_eq!(fair_share("b", 2, &shares, &b, now), 0);
}

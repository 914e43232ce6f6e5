//! A settlement provider for the tests of both binaries (docs/design.md
//! rule 15): `psp` for the queue `refunds`, read with the fake provider's
//! preset.

use jobfence_domain::budget::Budget;
use jobfence_domain::providers::{ChangeBy, PutProvider};
use jobfence_domain::settlement::mapping::{Mapping, RawLine};
use jobfence_domain::settlement::records::{PutSettlementSettings, QueueAmounts};

/// The queue of the settlement tests.
pub const Q: &str = "refunds";
/// Their provider.
pub const P: &str = "psp";

/// Who changed the provider's settings in a test.
pub fn by() -> ChangeBy {
    ChangeBy {
        operator: "alice".into(),
        reason: "settlement test".into(),
    }
}

/// [`provider`] on any coordinator's store; `amounts`: whether the queue
/// keeps its amounts at `/amount` and `/currency`.
pub async fn provider_on(store: &jobfence_store::JobStore, amounts: bool) {
    store
        .put_provider(&PutProvider {
            name: P.into(),
            budget: Budget {
                rate_per_second: 1000.0,
                burst: 1000,
                max_in_flight: None,
                execute_cost: 1,
                reconcile_cost: 1,
                per_key: Default::default(),
            },
            queues: vec![Q.into()],
            by: by(),
        })
        .await
        .unwrap();
    store
        .put_settlement_settings(&PutSettlementSettings {
            provider: P.into(),
            preset: Some("fake".into()),
            mapping: Mapping::fake(),
            lag: std::time::Duration::ZERO,
            queues: if amounts {
                vec![QueueAmounts {
                    queue: Q.into(),
                    amount_pointer: Some("/amount".into()),
                    currency_pointer: Some("/currency".into()),
                }]
            } else {
                vec![]
            },
            by: by(),
        })
        .await
        .unwrap();
}

/// A fake-provider report line.
pub fn line(n: u64, reference: &str, key: &str, amount: i64, status: &str) -> RawLine {
    RawLine {
        line: n,
        fields: [
            ("id", reference.to_owned()),
            ("merchant_reference", key.to_owned()),
            ("amount", amount.to_string()),
            ("currency", "usd".to_owned()),
            ("status", status.to_owned()),
            ("created", "1764547200".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect(),
        unreadable: Default::default(),
    }
}

/// A day at midnight UTC, as the database stores times.
pub fn day(s: &str) -> jobfence_domain::DbTime {
    jobfence_domain::DbTime::parse_from_str(&format!("{s} 00:00:00"), "%Y-%m-%d %H:%M:%S").unwrap()
}

/// A period covering every job a test has made so far: from 2000 to now (a
/// report covers a period that has ended).
pub fn until_now() -> (jobfence_domain::DbTime, jobfence_domain::DbTime) {
    (day("2000-01-01"), chrono::Utc::now().naive_utc())
}

/// Imports `lines` as `provider`'s report of a period covering every job a
/// test has made ([`until_now`]), by `alice`, through the coordinator.
pub async fn import(
    coordinator: &jobfence_core::Coordinator,
    provider: &str,
    lines: &[RawLine],
) -> jobfence_core::settlement::ImportSummary {
    import_period(coordinator, provider, until_now(), lines).await
}

/// [`import`] as the report of `period` (`[start, end)`).
pub async fn import_period(
    coordinator: &jobfence_core::Coordinator,
    provider: &str,
    period: (jobfence_domain::DbTime, jobfence_domain::DbTime),
    lines: &[RawLine],
) -> jobfence_core::settlement::ImportSummary {
    let mut import = coordinator
        .start_import(jobfence_core::settlement::ImportHeader {
            provider: provider.into(),
            period,
            operator: "alice".into(),
            check_only: false,
            allow_empty: true,
        })
        .await
        .unwrap();
    import.lines(lines).await.unwrap();
    import.finish().await.unwrap()
}

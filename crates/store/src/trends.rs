//! The recent state changes of every queue ([`StateChange`]), from the events table: what
//! the console's trend lines are rebuilt from, so they are the same on
//! every coordinator and survive a restart (no table of their own).

use super::{micros, rows, JobStore};
use jobfence_domain::admin::StateChange;
use jobfence_domain::{CoordinatorError, JobState};
use std::time::Duration;

impl JobStore {
    /// The state changes of the last `window`, per queue and bucket.
    pub async fn state_changes(
        &self,
        window: Duration,
    ) -> Result<Vec<StateChange>, CoordinatorError> {
        let found = self
            .fetch_rows(
                sqlx::query(include_str!("queries/admin/state_changes.sql")).bind(micros(window)),
            )
            .await;
        let state = |s: Option<String>| s.and_then(|s| s.parse::<JobState>().ok());
        found?
            .iter()
            .map(|r| {
                Ok(StateChange {
                    queue: rows::text(r, "queue")?,
                    bucket: u32::try_from(rows::get::<i64>(r, "bucket")?.max(0)).unwrap_or(0),
                    from: state(rows::opt_text(r, "from_state")?),
                    to: state(rows::opt_text(r, "to_state")?),
                    jobs: u64::try_from(rows::get::<i64>(r, "n")?).unwrap_or(0),
                })
            })
            .collect()
    }
}

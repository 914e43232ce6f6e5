//! The fencing rule (docs/design.md rule 3), as a pure function of the row read
//! under `SELECT … FOR UPDATE` and the attempt the caller presented.
//!
//! Only the current attempt of a `running` job may write. Lease expiry does
//! not enter into it (rule 1): an expired lease only opens the job to
//! takeover; the holder keeps its write right until a takeover commits.

use super::{CoordinatorError, JobState};

/// What a fenced write may do, given the locked row.
#[derive(Debug)]
pub enum FenceCheck {
    /// The caller holds the job: apply the write.
    Holder,
    /// The caller does not hold the job. If this exact call was already
    /// applied it is a replay (answer OK, write nothing); otherwise refuse
    /// with the carried error.
    NotHolder(CoordinatorError),
}

/// Decides whether `presented` may write to a job whose locked row has
/// `current` attempt and `state`.
///
/// Refusals: `AttemptSuperseded` when a later claim or takeover replaced the
/// caller; `AttemptNotIssued` for an attempt never handed out; `JobNotRunning`
/// when the attempt is current but the job already left `running`.
pub fn check(job_id: u64, state: JobState, current: u64, presented: u64) -> FenceCheck {
    use std::cmp::Ordering::*;
    match presented.cmp(&current) {
        Less => FenceCheck::NotHolder(CoordinatorError::AttemptSuperseded {
            job_id,
            presented,
            current,
            state,
        }),
        Greater => FenceCheck::NotHolder(CoordinatorError::AttemptNotIssued {
            job_id,
            presented,
            current,
        }),
        Equal if state == JobState::Running => FenceCheck::Holder,
        Equal => FenceCheck::NotHolder(CoordinatorError::JobNotRunning {
            job_id,
            attempt: current,
            state,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_current_attempt_of_a_running_job_holds_it() {
        assert!(matches!(
            check(1, JobState::Running, 8, 8),
            FenceCheck::Holder
        ));
        assert!(matches!(
            check(1, JobState::Succeeded, 8, 7),
            FenceCheck::NotHolder(CoordinatorError::AttemptSuperseded {
                presented: 7,
                current: 8,
                state: JobState::Succeeded,
                ..
            })
        ));
        assert!(matches!(
            check(1, JobState::Running, 8, 7),
            FenceCheck::NotHolder(CoordinatorError::AttemptSuperseded { .. })
        ));
        assert!(matches!(
            check(1, JobState::Running, 8, 9),
            FenceCheck::NotHolder(CoordinatorError::AttemptNotIssued { .. })
        ));
        for state in JobState::ALL {
            if state != JobState::Running {
                assert!(matches!(
                    check(1, state, 8, 8),
                    FenceCheck::NotHolder(CoordinatorError::JobNotRunning { .. })
                ));
            }
        }
    }
}

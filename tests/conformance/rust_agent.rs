//! The conformance agent of the Rust SDK (`jobfence-worker`), in process:
//! the same line protocol as `agent.py` and `agent.js` (README.md beside
//! this file), over channels instead of stdin/stdout.

use jobfence_worker::proto::NextAction;
use jobfence_worker::{
    reason, ClaimError, ClaimedJob, Credentials, Disposition, Enqueue, RetryPolicy, WorkerClient,
    WorkerConfig, WriteError,
};
use std::time::Duration;
use tokio::sync::mpsc;

/// Starts the agent, presenting `credentials` (TLS and a token, or
/// nothing): commands in, replies out.
pub fn spawn(
    target: String,
    worker_id: String,
    queue: String,
    credentials: Credentials,
) -> (
    mpsc::UnboundedSender<String>,
    mpsc::UnboundedReceiver<String>,
) {
    let (cmd_tx, mut cmd_rx) = mpsc::unbounded_channel::<String>();
    let (reply_tx, reply_rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let config = WorkerConfig {
            retry: RetryPolicy::default(),
            credentials,
            ..WorkerConfig::new(worker_id, queue)
        };
        let client = WorkerClient::connect(format!("http://{target}"), config)
            .await
            .expect("the Rust agent connects");
        let mut handles: Vec<ClaimedJob> = Vec::new();
        while let Some(line) = cmd_rx.recv().await {
            let words: Vec<&str> = line.split_whitespace().collect();
            let reply = match words.as_slice() {
                ["quit"] => break,
                ["reasons"] => {
                    let mut all = reason::ALL.to_vec();
                    all.sort_unstable();
                    format!("reasons {}", all.join(" "))
                }
                ["held"] => format!("held {}", handles.len()),
                ["retries"] => format!("retries {}", client.retries()),
                ["get", id] => match client.get_job(id.parse().unwrap()).await {
                    Ok((job, _)) => format!(
                        "job {} {}",
                        job.state()
                            .as_str_name()
                            .trim_start_matches("JOB_STATE_")
                            .to_lowercase(),
                        job.attempt
                    ),
                    Err(e) => write_error(&e),
                },
                ["enqueue", key, fairness_key, priority] => {
                    enqueue(&client, &client.config().queue, key, fairness_key, priority).await
                }
                ["fair", i] => {
                    let job = &handles[i.parse::<usize>().unwrap()];
                    format!(
                        "fair priority={} fairness_key={}",
                        job.priority(),
                        job.fairness_key()
                    )
                }
                ["claim"] => match client.claim(1).await {
                    Ok(mut jobs) if !jobs.is_empty() => claimed(&mut handles, jobs.remove(0)),
                    Ok(_) => "empty".to_owned(),
                    Err(e) => claim_error(&e),
                },
                ["takeover", id] => match client.takeover(id.parse().unwrap()).await {
                    Ok(job) => claimed(&mut handles, job),
                    Err(e) => claim_error(&e),
                },
                ["complete", i, r] => {
                    let body = format!(r#"{{"id":"{r}"}}"#);
                    match handles[i.parse::<usize>().unwrap()]
                        .complete(r, &body)
                        .await
                    {
                        Ok(w) => format!("ok replayed={}", u8::from(w.replayed)),
                        Err(e) => write_error(&e),
                    }
                }
                ["complete-next", i, r] => {
                    let body = format!(r#"{{"id":"{r}"}}"#);
                    let job = &mut handles[i.parse::<usize>().unwrap()];
                    job.ask_for_next_job();
                    let write = match job.complete(r, &body).await {
                        Ok(w) => format!("ok replayed={}", u8::from(w.replayed)),
                        Err(e) => write_error(&e),
                    };
                    match job.take_next_job() {
                        Some(next) => format!("{write} next {}", claimed(&mut handles, next)),
                        None => format!("{write} next empty"),
                    }
                }
                ["fail", i, d] => {
                    let disposition = match *d {
                        "retry_reconcile" => Disposition::RetryReconcile,
                        "retry_execute" => Disposition::RetryExecute,
                        "failed" => Disposition::Failed,
                        _ => Disposition::ManualReview,
                    };
                    let job = &mut handles[i.parse::<usize>().unwrap()];
                    match job.fail(disposition, "conformance", Duration::ZERO).await {
                        Ok(w) => format!(
                            "ok applied={} replayed={}",
                            disposition_name(w.applied),
                            u8::from(w.replayed)
                        ),
                        Err(e) => write_error(&e),
                    }
                }
                // The runner (Worker::run) with a handler that must not
                // run: only sent when its claims are refused, so it stops.
                ["run"] => {
                    let report = jobfence_worker::Worker::new(client.clone())
                        .run(Refused, std::future::pending())
                        .await;
                    match report.stopped_by {
                        Some(why) if why.starts_with("denied") => {
                            "error denied recorded=0 current_attempt=0".to_owned()
                        }
                        other => format!("error other stopped_by={other:?}"),
                    }
                }
                _ => format!("unknown command {line}"),
            };
            if reply_tx.send(reply).is_err() {
                break;
            }
        }
    });
    (cmd_tx, reply_rx)
}

/// `enqueue KEY FAIRNESS_KEY|- PRIORITY` on the agent's queue, answered
/// with what the returned job says.
async fn enqueue(
    client: &WorkerClient,
    queue: &str,
    key: &str,
    fairness_key: &str,
    priority: &str,
) -> String {
    let mut job = Enqueue::new(queue, key, "{}").priority(priority.parse().unwrap());
    if fairness_key != "-" {
        job = job.fairness_key(fairness_key);
    }
    match client.enqueue(job).await {
        Ok(done) => format!(
            "enqueued {} created={} priority={} fairness_key={}",
            done.job.job_id,
            u8::from(done.created),
            done.job.priority,
            done.job.fairness_key
        ),
        Err(e) => write_error(&e),
    }
}

/// The handler of the `run` command: its runner never gets a job.
struct Refused;

impl jobfence_worker::Handler for Refused {
    async fn handle(&self, job: &mut ClaimedJob) -> Result<(), jobfence_worker::HandlerError> {
        panic!("a refused runner was handed job {}", job.job_id());
    }
}

fn claimed(handles: &mut Vec<ClaimedJob>, job: ClaimedJob) -> String {
    let action = match job.next_action() {
        NextAction::Reconcile => "reconcile",
        _ => "execute",
    };
    let reply = format!(
        "claimed {} {} {} {action} {} {}",
        handles.len(),
        job.job_id(),
        job.attempt(),
        u8::from(job.is_takeover()),
        job.observations().len()
    );
    handles.push(job);
    reply
}

fn disposition_name(d: Disposition) -> &'static str {
    match d {
        Disposition::RetryReconcile => "retry_reconcile",
        Disposition::RetryExecute => "retry_execute",
        Disposition::Failed => "failed",
        Disposition::ManualReview => "manual_review",
    }
}

fn error_line(kind: &str, recorded: bool, current: u64) -> String {
    format!(
        "error {kind} recorded={} current_attempt={current}",
        u8::from(recorded)
    )
}

fn claim_error(e: &ClaimError) -> String {
    match e {
        ClaimError::OutcomeUnknown(_) => error_line("outcome_unknown", false, 0),
        ClaimError::Unavailable(_) => error_line("unavailable", false, 0),
        ClaimError::Invalid(_) => error_line("invalid", false, 0),
        ClaimError::NotFound => error_line("not_found", false, 0),
        ClaimError::LeaseNotExpired { current_attempt } => {
            error_line("lease_not_expired", false, *current_attempt)
        }
        ClaimError::Finished { .. } => error_line("finished", false, 0),
        ClaimError::NotRunning { .. } => error_line("not_running", false, 0),
        ClaimError::Denied(_) => error_line("denied", false, 0),
        ClaimError::ProviderHeld { .. } => error_line("provider_held", false, 0),
        ClaimError::ApiVersion(_) => error_line("api_version", false, 0),
        ClaimError::Other(_) => error_line("other", false, 0),
    }
}

fn write_error(e: &WriteError) -> String {
    match e {
        WriteError::Superseded {
            current_attempt,
            observation_recorded,
            ..
        } => error_line("superseded", *observation_recorded, *current_attempt),
        WriteError::NotRunning {
            observation_recorded,
            ..
        } => error_line("not_running", *observation_recorded, 0),
        WriteError::NotFound => error_line("not_found", false, 0),
        WriteError::Invalid(_) => error_line("invalid", false, 0),
        WriteError::OutcomeUnknown(_) => error_line("outcome_unknown", false, 0),
        WriteError::Unavailable(_) => error_line("unavailable", false, 0),
        WriteError::Denied(_) => error_line("denied", false, 0),
        WriteError::ApiVersion(_) => error_line("api_version", false, 0),
        WriteError::Other(_) => error_line("other", false, 0),
    }
}

//! `jobfence jobs enqueue`: one job from the terminal (Enqueue), or a file
//! of them, one JSON object a line (EnqueueBatch, with a progress line and
//! a summary). A producer's (or a worker's) token: an operator's is
//! refused, ROLE_NOT_ALLOWED. An operation key already enqueued answers
//! its job with `created: false` (docs/design.md rule 1): running the same
//! command or file again enqueues nothing twice.

use crate::connection::{channel, Connection};
use crate::duration;
use crate::refusal::{refused_with_flags, FlagNames};
use crate::render::{print_json, state_name};
use anyhow::Context;
use clap::Args;
use jobfence_api::v1::job_coordinator_client::JobCoordinatorClient;
use jobfence_api::v1::{self as proto, enqueue_batch_result::Result as Item};
use jobfence_domain::fairness::{self, Priority};
use serde_json::{json, Value};
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::Duration;

/// Items per EnqueueBatch call (the coordinator takes up to 1000 by
/// default, `serve --max-enqueue-batch`).
const BATCH: usize = 500;
/// Refused lines the summary lists one by one (all are counted).
const LISTED: usize = 20;

/// Arguments of `jobs enqueue`.
#[derive(Debug, Args)]
pub struct EnqueueArgs {
    /// The queue (for --from: of every line that names none).
    #[arg(long)]
    pub queue: Option<String>,
    /// The operation key: the job's stable identity, sent to the provider.
    #[arg(long, conflicts_with = "from", requires = "payload")]
    pub key: Option<String>,
    /// The payload, as JSON (checked here, so that a quoting mistake of the
    /// shell is caught before it is stored).
    #[arg(long, conflicts_with = "from", requires = "key")]
    pub payload: Option<String>,
    /// Due this long from now (e.g. 30s) instead of at once.
    #[arg(long, value_parser = crate::args::duration_arg)]
    pub delay: Option<Duration>,
    /// The fairness key (a merchant, a tenant): claims go round-robin
    /// across a queue's keys (docs/design.md rule 18).
    #[arg(long)]
    pub fairness_key: Option<String>,
    /// 1 (lowest) to 9 (most urgent); 5 when left out (or 0).
    #[arg(long)]
    pub priority: Option<u32>,
    /// A file of jobs, one JSON object a line: `{"queue": "refunds",
    /// "key": "refund-42", "payload": {…}, "delay": "30s",
    /// "fairness_key": "merchant-7", "priority": 7}` (all but key and
    /// payload optional; payload any JSON, or a string taken as it is;
    /// --fairness-key and --priority are the defaults of a line that
    /// names none); `-` for standard input.
    #[arg(long)]
    pub from: Option<PathBuf>,
}

const FLAGS: &FlagNames = &[
    ("queue", "--queue"),
    ("operation_key", "--key"),
    ("payload", "--payload"),
    ("delay", "--delay"),
    ("fairness_key", "--fairness-key"),
    ("priority", "--priority"),
];

/// Runs `jobs enqueue`, printing to `out`.
pub(crate) async fn run(
    conn: &Connection,
    args: EnqueueArgs,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    let mut client = JobCoordinatorClient::new(channel(conn).await?);
    if let Some(path) = &args.from {
        return from_file(&mut client, conn.json, &args, path, out).await;
    }
    let (Some(key), Some(payload)) = (&args.key, &args.payload) else {
        anyhow::bail!("give --key and --payload for one job, or --from FILE for many");
    };
    let queue = args
        .queue
        .clone()
        .context("--queue is required for one job")?;
    serde_json::from_str::<Value>(payload)
        .with_context(|| format!("--payload is not JSON: {payload}"))?;
    let done = client
        .enqueue(proto::EnqueueRequest {
            queue,
            operation_key: key.clone(),
            payload: payload.clone(),
            delay: args.delay.map(duration),
            fairness_key: args.fairness_key.clone().unwrap_or_default(),
            priority: args.priority.unwrap_or_default(),
        })
        .await
        .map_err(|s| refused_with_flags(s, FLAGS))?
        .into_inner();
    let job = done.job.unwrap_or_default();
    if conn.json {
        return print_json(out, &job_json(&job, done.created));
    }
    writeln!(
        out,
        "{} job {} in queue {} (key {}), {}",
        if done.created {
            "enqueued"
        } else {
            "already there:"
        },
        job.job_id,
        job.queue,
        job.operation_key,
        state_name(job.state)
    )?;
    Ok(())
}

fn job_json(job: &proto::Job, created: bool) -> Value {
    json!({
        "job_id": job.job_id,
        "queue": job.queue,
        "operation_key": job.operation_key,
        "state": state_name(job.state),
        "created": created,
    })
}

/// What a file's import did.
#[derive(Default)]
struct Tally {
    read: u64,
    created: u64,
    existing: u64,
    refused: Vec<(u64, String)>,
    refused_count: u64,
}

impl Tally {
    fn refuse(&mut self, line: u64, why: String) {
        self.refused_count += 1;
        if self.refused.len() < LISTED {
            self.refused.push((line, why));
        }
    }
}

/// One line of a `--from` file as a request, or why it is refused.
fn item(line: &str, args: &EnqueueArgs) -> Result<proto::EnqueueRequest, String> {
    let queue = args.queue.as_deref();
    let v: Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    let text = |name: &str| v.get(name).and_then(Value::as_str).map(str::to_owned);
    let queue = text("queue")
        .or(queue.map(str::to_owned))
        .ok_or("no \"queue\", and no --queue")?;
    let key = text("key")
        .or_else(|| text("operation_key"))
        .ok_or("no \"key\"")?;
    let payload = match v.get("payload") {
        None => return Err("no \"payload\"".into()),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    let delay = match text("delay") {
        None => None,
        Some(d) => Some(duration(
            humantime::parse_duration(&d).map_err(|e| format!("\"delay\": {e}"))?,
        )),
    };
    let priority = match v.get("priority") {
        None => args.priority.unwrap_or_default(),
        Some(p) => p
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .ok_or("\"priority\" must be a number from 1 to 9")?,
    };
    // Checked here by the coordinator's own rules (docs/api.md, "Fair
    // hand-out"), so that a bad line is refused alone, by its number, and
    // the batch it would have spoiled goes.
    let mut v = jobfence_domain::validate::Violations::default();
    let raw_key = text("fairness_key")
        .or_else(|| args.fairness_key.clone())
        .unwrap_or_default();
    let fairness_key = fairness::key_field(&mut v, "fairness_key", raw_key).unwrap_or_default();
    Priority::field(&mut v, "priority", priority);
    if let Some(f) = v.0.first() {
        return Err(format!("\"{}\" {}", f.field, f.description));
    }
    Ok(proto::EnqueueRequest {
        queue,
        operation_key: key,
        payload,
        delay,
        fairness_key,
        priority,
    })
}

async fn from_file(
    client: &mut JobCoordinatorClient<crate::connection::Authed>,
    json: bool,
    args: &EnqueueArgs,
    path: &std::path::Path,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    let reader: Box<dyn BufRead> = if path.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        Box::new(std::io::BufReader::new(f))
    };
    let mut tally = Tally::default();
    let mut batch: Vec<(u64, proto::EnqueueRequest)> = Vec::with_capacity(BATCH);
    let mut last = std::time::Instant::now();
    for (n, line) in reader.lines().enumerate() {
        let number = n as u64 + 1;
        let line = line.with_context(|| format!("reading line {number}"))?;
        if line.trim().is_empty() {
            continue;
        }
        tally.read += 1;
        let req = match item(&line, args) {
            Ok(req) => req,
            Err(why) => {
                tally.refuse(number, why);
                continue;
            }
        };
        // One queue a batch: a refusal of the whole call (a queue the
        // caller may not use) is then the refusal of that queue's lines.
        if batch.first().is_some_and(|(_, b)| b.queue != req.queue) {
            send(client, &mut batch, &mut tally).await?;
        }
        batch.push((number, req));
        if batch.len() >= BATCH {
            send(client, &mut batch, &mut tally).await?;
            if last.elapsed().as_secs() >= 1 {
                eprint!(
                    "\rjobs: {} lines read, {} enqueued",
                    tally.read, tally.created
                );
                last = std::time::Instant::now();
            }
        }
    }
    send(client, &mut batch, &mut tally).await?;
    eprintln!(
        "\rjobs: {} lines read, {} enqueued",
        tally.read, tally.created
    );
    summary(out, json, &tally)?;
    anyhow::ensure!(
        tally.refused_count == 0,
        "{} line(s) refused; the others were enqueued (running the file again enqueues nothing twice)",
        tally.refused_count
    );
    Ok(())
}

async fn send(
    client: &mut JobCoordinatorClient<crate::connection::Authed>,
    batch: &mut Vec<(u64, proto::EnqueueRequest)>,
    tally: &mut Tally,
) -> anyhow::Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    let (numbers, items): (Vec<u64>, Vec<_>) = std::mem::take(batch).into_iter().unzip();
    let answer = match client
        .enqueue_batch(proto::EnqueueBatchRequest { items })
        .await
    {
        Ok(answer) => answer.into_inner(),
        // The call refused as a whole for what its lines say (their queue,
        // a field): those lines are refused, the file goes on.
        Err(s) if is_about_the_lines(s.code()) => {
            let why = crate::describe_status(&s);
            for number in numbers {
                tally.refuse(number, why.clone());
            }
            return Ok(());
        }
        Err(s) => {
            return Err(refused_with_flags(s, FLAGS))
                .with_context(|| format!("lines {}–{}", numbers[0], numbers[numbers.len() - 1]))
        }
    };
    for (number, result) in numbers.into_iter().zip(answer.results) {
        match result.result {
            Some(Item::Enqueued(e)) if e.created => tally.created += 1,
            Some(Item::Enqueued(_)) => tally.existing += 1,
            Some(Item::Error(e)) => tally.refuse(number, format!("{}: {}", e.reason, e.message)),
            None => tally.refuse(number, "no answer for this line".into()),
        }
    }
    Ok(())
}

/// A refusal of a whole batch that its lines caused (and the next batch
/// may not), as opposed to the coordinator being unreachable.
fn is_about_the_lines(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::PermissionDenied | tonic::Code::InvalidArgument
    )
}

fn summary(out: &mut (dyn Write + Send), json: bool, t: &Tally) -> anyhow::Result<()> {
    if json {
        return print_json(
            out,
            &json!({
                "lines_read": t.read,
                "created": t.created,
                "already_there": t.existing,
                "refused": t.refused_count,
                "refused_lines": t.refused.iter()
                    .map(|(line, why)| json!({"line": line, "reason": why}))
                    .collect::<Vec<_>>(),
            }),
        );
    }
    writeln!(
        out,
        "{} lines read: {} enqueued, {} already there, {} refused",
        t.read, t.created, t.existing, t.refused_count
    )?;
    for (line, why) in &t.refused {
        writeln!(out, "  line {line}: {why}")?;
    }
    Ok(())
}

//! One conformance suite for every worker client: the protocol's cases,
//! written once as data ([`CASES`]), run against the Rust SDK, the Python
//! package (its synchronous and its asyncio client), the Node client and
//! the Go client, each through a small agent that speaks the
//! line protocol of `tests/conformance/README.md`. The agents talk to an
//! in-process coordinator through a proxy the driver can make lose answers;
//! every expectation is an exact reply or an exact database state. Then
//! each client runs against a coordinator with TLS and the callers file
//! on (as scripts/serve runs it), with the credentials of the environment
//! every client reads: without a token or with one of another queue it is
//! refused `denied` and nothing changes; with its own, it claims and
//! completes.
//!
//! Python is `$JOBFENCE_PYTHON` (scripts/test: .local/venv), Node is
//! `$JOBFENCE_NODE` or `node` with sdk/node's packages installed by
//! scripts/node-env (`npm ci`), the Go agent is built once per run with
//! `sdk/go/tools/go` (`$JOBFENCE_GO`, scripts/go-env: GOPATH mode against
//! Debian's packages). A missing runtime fails the test; it never skips.

use jobfence_testkit as kit;

mod api_version;
#[path = "../conformance/rust_agent.rs"]
mod rust_agent;

use jobfence_api::v1::TakeoverRequest;
use jobfence_domain::JobState;
use jobfence_store::JobStore;
use jobfence_worker::observation_dedup_key;
use kit::sdk::Proxy;
use kit::secure::Secure;
use kit::Harness;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// One step of a case. `{job}` in a command or a reply stands for the
/// case's job id.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// Send a command and expect exactly this reply.
    Ask(&'static str, &'static str),
    /// Send a command; its reply is read by the next `Reply`.
    Send(&'static str),
    /// The reply to the last `Send`.
    Reply(&'static str),
    /// The job's lease runs out (the DB says so).
    ExpireLease,
    /// Another worker takes the job over (a raw Takeover).
    TakeoverElsewhere,
    /// From now, the coordinator's answers to the agent are dropped.
    LoseAnswers,
    /// Wait until the job's row is in this state (the lost call committed),
    /// then cut every connection of the agent and let answers through again.
    CutOnceRow(JobState),
    /// Pause the next Claim just before its COMMIT.
    PauseClaimCommit,
    /// Kill the paused Claim's database session, then let it COMMIT: the
    /// coordinator cannot know the outcome (it was rolled back).
    LoseClaimCommit,
    /// The job's row: state and attempt.
    Row(JobState, u64),
    /// The job's observations: exactly one, from the agent's worker at this
    /// attempt, with this provider reference and the SDKs' dedup key.
    ObservedOnce(u64, &'static str),
    /// How many events of this kind the job has.
    Events(&'static str, usize),
    /// A second job of the case's queue is enqueued: `{next}` stands for
    /// its id from now on.
    EnqueueNext,
    /// The second job's row: state and attempt.
    NextRow(JobState, u64),
    /// Send an `enqueue` command: the reply must be `enqueued ID` and then
    /// exactly this; `{next}` stands for ID from now on.
    AskEnqueue(&'static str, &'static str),
    /// The second job's row: its priority and fairness key ("": none).
    NextFair(u8, &'static str),
}

use Step::*;

/// The protocol's cases. Every agent must pass every one.
const CASES: &[(&str, &[Step])] = &[
    (
        "stale-write-after-takeover-is-superseded",
        &[
            Ask("claim", "claimed 0 {job} 1 execute 0 0"),
            ExpireLease,
            TakeoverElsewhere,
            Ask(
                "fail 0 retry_reconcile",
                "error superseded recorded=0 current_attempt=2",
            ),
            Row(JobState::Running, 2),
            Events("stale_write_rejected", 1),
        ],
    ),
    (
        "replay-after-a-lost-response",
        &[
            Ask("claim", "claimed 0 {job} 1 execute 0 0"),
            LoseAnswers,
            Send("complete 0 re_replay"),
            CutOnceRow(JobState::Succeeded),
            Reply("ok replayed=1"),
            Ask("get {job}", "job succeeded 1"),
            Row(JobState::Succeeded, 1),
            Events("completed", 1),
        ],
    ),
    (
        "reconcile-first-after-a-takeover",
        &[
            Ask("claim", "claimed 0 {job} 1 execute 0 0"),
            ExpireLease,
            Ask("takeover {job}", "claimed 1 {job} 2 reconcile 1 0"),
            ExpireLease,
            Ask("claim", "claimed 2 {job} 3 reconcile 1 0"),
            Ask(
                "fail 2 retry_execute",
                "ok applied=retry_execute replayed=0",
            ),
            Ask("claim", "claimed 3 {job} 4 execute 0 0"),
        ],
    ),
    (
        "a-late-result-becomes-an-observation-the-next-holder-sees",
        &[
            Ask("claim", "claimed 0 {job} 1 execute 0 0"),
            ExpireLease,
            TakeoverElsewhere,
            Ask(
                "complete 0 re_late",
                "error superseded recorded=1 current_attempt=2",
            ),
            Row(JobState::Running, 2),
            ObservedOnce(1, "re_late"),
            ExpireLease,
            Ask("claim", "claimed 1 {job} 3 reconcile 1 1"),
            Ask("complete 1 re_late", "ok replayed=0"),
            Row(JobState::Succeeded, 3),
        ],
    ),
    (
        "a-claim-whose-commit-was-lost-holds-nothing",
        &[
            PauseClaimCommit,
            Send("claim"),
            LoseClaimCommit,
            Reply("error outcome_unknown recorded=0 current_attempt=0"),
            Ask("held", "held 0"),
            Row(JobState::Ready, 0),
        ],
    ),
    (
        "a-claim-committed-but-unanswered-holds-nothing",
        &[
            // A call first: the connection must be up before answers are lost.
            Ask("get {job}", "job ready 0"),
            LoseAnswers,
            Send("claim"),
            CutOnceRow(JobState::Running),
            Reply("error outcome_unknown recorded=0 current_attempt=0"),
            Ask("held", "held 0"),
            Row(JobState::Running, 1),
        ],
    ),
    // A Complete that asks for the next job in the same call and
    // transaction (docs/design.md rule 16), as every client's run loop
    // sends it.
    (
        "a-complete-hands-out-the-next-job",
        &[
            Ask("claim", "claimed 0 {job} 1 execute 0 0"),
            EnqueueNext,
            Ask(
                "complete-next 0 re_next",
                "ok replayed=0 next claimed 1 {next} 1 execute 0 0",
            ),
            Row(JobState::Succeeded, 1),
            NextRow(JobState::Running, 1),
            Ask("complete-next 1 re_last", "ok replayed=0 next empty"),
            NextRow(JobState::Succeeded, 1),
        ],
    ),
    (
        "a-stale-complete-still-gets-its-next-job",
        &[
            Ask("claim", "claimed 0 {job} 1 execute 0 0"),
            ExpireLease,
            TakeoverElsewhere,
            EnqueueNext,
            Ask(
                "complete-next 0 re_stale",
                "error superseded recorded=1 current_attempt=2 next claimed 1 {next} 1 execute 0 0",
            ),
            Row(JobState::Running, 2),
            NextRow(JobState::Running, 1),
        ],
    ),
    (
        "a-complete-whose-commit-is-unknown-hands-out-no-job",
        &[
            Ask("claim", "claimed 0 {job} 1 execute 0 0"),
            EnqueueNext,
            LoseAnswers,
            Send("complete-next 0 re_lost"),
            CutOnceRow(JobState::Succeeded),
            // The client's retry of the lost call is a replay: it claims
            // nothing, and the job the lost call claimed stays leased to
            // nobody who knows it (its lease runs out; a takeover
            // reconciles it).
            Reply("ok replayed=1 next empty"),
            Ask("held", "held 1"),
            NextRow(JobState::Running, 1),
            Events("completed", 1),
        ],
    ),
    // The fair hand-out's fields (docs/design.md rule 18): sent with an
    // enqueue, read back from the job it returns and from the handle of
    // its claim, which the more urgent job wins over the case's job.
    (
        "an-enqueue-carries-its-fairness-key-and-priority",
        &[
            AskEnqueue(
                "enqueue fair-1 merchant-7 8",
                "created=1 priority=8 fairness_key=merchant-7",
            ),
            NextFair(8, "merchant-7"),
            Ask(
                "enqueue fair-1 merchant-7 8",
                "enqueued {next} created=0 priority=8 fairness_key=merchant-7",
            ),
            Ask("claim", "claimed 0 {next} 1 execute 0 0"),
            Ask("fair 0", "fair priority=8 fairness_key=merchant-7"),
            AskEnqueue("enqueue fair-2 - 0", "created=1 priority=5 fairness_key="),
            NextFair(5, ""),
            Ask(
                "enqueue fair-3 merchant-7 10",
                "error invalid recorded=0 current_attempt=0",
            ),
        ],
    ),
];

const WORKER: &str = "conformance-worker";
const REPLY_TIMEOUT: Duration = Duration::from_secs(60);

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// How to start an agent of one client.
#[derive(Clone, Copy)]
pub(crate) enum Client {
    Rust,
    Python,
    PythonAsyncio,
    Node,
    Go,
}

/// The Go agent (tests/conformance/agent.go), built once per test run.
fn go_agent() -> &'static Path {
    static AGENT: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    AGENT.get_or_init(|| {
        crate::go_sdk::build(
            repo().join("tests/conformance/agent.go").to_str().unwrap(),
            &Path::new(env!("CARGO_TARGET_TMPDIR")).join("go-bin/conformance-agent"),
        )
    })
}

/// A running agent: commands in, reply lines out.
pub(crate) struct Agent {
    commands: mpsc::UnboundedSender<String>,
    replies: mpsc::UnboundedReceiver<String>,
    child: Option<tokio::process::Child>,
    pub(crate) name: String,
}

impl Agent {
    pub(crate) fn start(client: Client, target: &str, queue: &str) -> Agent {
        Self::start_as(client, target, queue, None)
    }

    /// [`Agent::start`] against `secure`'s TLS, presenting the token of
    /// `caller` (none: `None`), when `secure` is given.
    fn start_as(
        client: Client,
        target: &str,
        queue: &str,
        secure: Option<(&Secure, Option<&str>)>,
    ) -> Agent {
        let mut creds_env: Vec<(&str, String)> = vec![];
        if let Some((s, caller)) = secure {
            creds_env.push(("JOBFENCE_TLS_CA", s.files.ca.display().to_string()));
            if let Some(c) = caller {
                creds_env.push((
                    "JOBFENCE_TOKEN_FILE",
                    s.files.token(c).display().to_string(),
                ));
            }
        }
        let (program, args, envs): (String, Vec<String>, Vec<(&str, String)>) = match client {
            Client::Rust => {
                let credentials = secure
                    .map(|(s, caller)| s.creds(caller))
                    .unwrap_or_default();
                let (commands, replies) = rust_agent::spawn(
                    target.to_owned(),
                    WORKER.to_owned(),
                    queue.to_owned(),
                    credentials,
                );
                return Agent {
                    commands,
                    replies,
                    child: None,
                    name: "rust".into(),
                };
            }
            Client::Python | Client::PythonAsyncio => (
                std::env::var("JOBFENCE_PYTHON").unwrap_or_else(|_| "python3".into()),
                [repo()
                    .join("tests/conformance/agent.py")
                    .display()
                    .to_string()]
                .into_iter()
                .chain(matches!(client, Client::PythonAsyncio).then(|| "--aio".to_owned()))
                .collect(),
                vec![
                    (
                        "PYTHONPATH",
                        repo().join("sdk/python/src").display().to_string(),
                    ),
                    ("PYTHONUNBUFFERED", "1".into()),
                ],
            ),
            Client::Node => (
                std::env::var("JOBFENCE_NODE").unwrap_or_else(|_| "node".into()),
                vec![repo()
                    .join("tests/conformance/agent.js")
                    .display()
                    .to_string()],
                vec![],
            ),
            Client::Go => (go_agent().display().to_string(), vec![], vec![]),
        };
        let mut child = tokio::process::Command::new(&program)
            .args(&args)
            .args([target, WORKER, queue])
            .env_remove("JOBFENCE_TLS_CA")
            .env_remove("JOBFENCE_TLS_CLIENT_CERT")
            .env_remove("JOBFENCE_TLS_CLIENT_KEY")
            .env_remove("JOBFENCE_TOKEN_FILE")
            .env_remove("JOBFENCE_TOKEN")
            .envs(envs)
            .envs(creds_env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program} {args:?}: {e}"));
        let mut stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (commands, mut cmd_rx) = mpsc::unbounded_channel::<String>();
        let (reply_tx, replies) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(cmd) = cmd_rx.recv().await {
                if stdin
                    .write_all(format!("{cmd}\n").as_bytes())
                    .await
                    .is_err()
                {
                    break;
                }
                let _ = stdin.flush().await;
            }
        });
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if reply_tx.send(line).is_err() {
                    break;
                }
            }
        });
        Agent {
            commands,
            replies,
            child: Some(child),
            name: program,
        }
    }

    pub(crate) fn send(&self, cmd: &str) {
        self.commands
            .send(cmd.to_owned())
            .expect("agent is running");
    }

    pub(crate) async fn reply(&mut self, context: &str) -> String {
        match tokio::time::timeout(REPLY_TIMEOUT, self.replies.recv()).await {
            Ok(Some(line)) => line,
            Ok(None) => panic!("{context}: agent {} exited without a reply", self.name),
            Err(_) => panic!("{context}: no reply from agent {} in 60 s", self.name),
        }
    }

    pub(crate) async fn quit(mut self) {
        self.send("quit");
        if let Some(mut child) = self.child.take() {
            let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
                .await
                .expect("the agent quits")
                .unwrap();
            assert!(status.success(), "agent {} exited with {status}", self.name);
        }
    }
}

/// The ErrorInfo reasons of the coordinator (the enum ErrorReason of
/// errors.proto, from which its status mapping is generated), sorted.
fn server_reasons() -> Vec<String> {
    let mut out: Vec<String> = jobfence_api::v1::ErrorReason::ALL
        .iter()
        .map(|r| r.as_str_name().to_owned())
        .collect();
    out.sort();
    out
}

async fn conforms(client: Client) {
    let h = Harness::start().await;
    let proxy = Proxy::start(h.addr).await;
    let target = proxy.addr.to_string();

    // Every reason the coordinator sends is known to the client.
    let mut agent = Agent::start(client, &target, "conformance-reasons");
    agent.send("reasons");
    assert_eq!(
        agent.reply("reasons").await,
        format!("reasons {}", server_reasons().join(" ")),
        "the client's reasons differ from the coordinator's (errors.proto)"
    );
    agent.quit().await;

    for (case, steps) in CASES {
        let job = h
            .enqueue(case, &format!("refund-{case}"), "{}")
            .await
            .job_id;
        let mut agent = Agent::start(client, &target, case);
        let mut paused = None;
        let mut next_job = 0;
        for (i, step) in steps.iter().enumerate() {
            let context = format!("{} client, case {case}, step {i} {step:?}", agent.name);
            let fill = |s: &str| {
                s.replace("{job}", &job.to_string())
                    .replace("{next}", &next_job.to_string())
            };
            match *step {
                Ask(cmd, want) => {
                    agent.send(&fill(cmd));
                    assert_eq!(agent.reply(&context).await, fill(want), "{context}");
                }
                Send(cmd) => agent.send(&fill(cmd)),
                Reply(want) => assert_eq!(agent.reply(&context).await, fill(want), "{context}"),
                ExpireLease => h.force_lease_expired(job).await,
                TakeoverElsewhere => {
                    h.client
                        .clone()
                        .takeover(TakeoverRequest {
                            job_id: job,
                            worker_id: "another-worker".into(),
                            lease: None,
                        })
                        .await
                        .unwrap_or_else(|e| panic!("{context}: {e}"));
                }
                LoseAnswers => proxy.swallow_responses(true),
                CutOnceRow(state) => {
                    kit::sdk::wait_for_row(&h, job, "the lost call's commit", |j| j.state == state)
                        .await;
                    proxy.cut();
                    proxy.swallow_responses(false);
                }
                PauseClaimCommit => {
                    paused = Some(h.pauses.arm(jobfence_store::PausePoint::ClaimBeforeCommit))
                }
                LoseClaimCommit => {
                    let mut p = paused.take().expect("PauseClaimCommit first");
                    p.reached().await;
                    kit::sdk::kill_the_paused_session(&h, &p).await;
                    p.release();
                }
                Row(state, attempt) => {
                    let row = h.row(job).await;
                    assert_eq!((row.state, row.attempt), (state, attempt), "{context}");
                }
                ObservedOnce(attempt, reference) => {
                    let (_, obs) = JobStore::new(h.pool.clone()).get_job(job).await.unwrap();
                    assert_eq!(obs.len(), 1, "{context}: {obs:?}");
                    assert_eq!(obs[0].attempt, attempt, "{context}");
                    assert_eq!(
                        obs[0].provider_reference.as_deref(),
                        Some(reference),
                        "{context}"
                    );
                    assert_eq!(
                        obs[0].dedup_key,
                        observation_dedup_key(WORKER, reference),
                        "{context}"
                    );
                }
                Events(kind, n) => assert_eq!(h.count_events(job, kind).await, n, "{context}"),
                EnqueueNext => {
                    next_job = h.enqueue(case, &format!("next-{case}"), "{}").await.job_id;
                }
                NextRow(state, attempt) => {
                    let row = h.row(next_job).await;
                    assert_eq!((row.state, row.attempt), (state, attempt), "{context}");
                }
                AskEnqueue(cmd, want) => {
                    agent.send(cmd);
                    let reply = agent.reply(&context).await;
                    let (id, rest) = reply
                        .strip_prefix("enqueued ")
                        .and_then(|r| r.split_once(' '))
                        .unwrap_or_else(|| panic!("{context}: {reply:?}"));
                    assert_eq!(rest, want, "{context}");
                    next_job = id.parse().unwrap();
                }
                NextFair(priority, key) => {
                    let row = h.row(next_job).await;
                    assert_eq!(row.priority.get(), priority, "{context}");
                    assert_eq!(row.fairness_key.unwrap_or_default(), key, "{context}");
                }
            }
        }
        agent.quit().await;
    }
    drop(proxy);

    // Over TLS with bearer tokens, as scripts/serve runs the coordinator:
    // the client presents its credentials; a refusal of who it is comes
    // back as `denied` (typed, never retried) and writes nothing.
    let secure = Secure::over(h.pool.clone(), false).await;
    let target = secure.addr.to_string();
    let job = h.enqueue("refunds", "refund-over-tls", "{}").await.job_id;
    let denied = "error denied recorded=0 current_attempt=0";
    for caller in [None, Some("payouts-worker")] {
        let mut agent = Agent::start_as(client, &target, "refunds", Some((&secure, caller)));
        let context = format!("{} client over TLS as {caller:?}", agent.name);
        agent.send("claim");
        assert_eq!(agent.reply(&context).await, denied, "{context}");
        agent.send(&format!("get {job}"));
        assert_eq!(agent.reply(&context).await, denied, "{context}");
        if matches!(client, Client::Rust | Client::Node | Client::Go) {
            // The clients with a runner: it stops at the refusal and says
            // so, instead of claiming forever.
            agent.send("run");
            assert_eq!(agent.reply(&context).await, denied, "{context}: run");
        }
        agent.quit().await;
    }
    let row = h.row(job).await;
    assert_eq!((row.state, row.attempt), (JobState::Ready, 0));
    let mut agent = Agent::start_as(
        client,
        &target,
        "refunds",
        Some((&secure, Some("refunds-worker"))),
    );
    let context = format!("{} client over TLS as refunds-worker", agent.name);
    for (cmd, want) in [
        ("claim".to_owned(), format!("claimed 0 {job} 1 execute 0 0")),
        ("complete 0 re_tls".to_owned(), "ok replayed=0".to_owned()),
        (format!("get {job}"), "job succeeded 1".to_owned()),
    ] {
        agent.send(&cmd);
        assert_eq!(agent.reply(&context).await, want, "{context}: {cmd}");
    }
    agent.quit().await;
    secure.stop().await;
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_sdk_conforms() {
    conforms(Client::Rust).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_conforms() {
    conforms(Client::Python).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_asyncio_client_conforms() {
    conforms(Client::PythonAsyncio).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_client_conforms() {
    conforms(Client::Node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_go_client_conforms() {
    conforms(Client::Go).await;
}

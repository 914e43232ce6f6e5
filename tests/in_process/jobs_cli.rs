//! `jobfence jobs enqueue` as a producer runs it from a terminal, against a
//! coordinator with TLS and the callers file: one job, the same again
//! (the job it already is, nothing twice), a file of JSON lines through
//! EnqueueBatch with a line refused by its number, and the bad input
//! (payload not JSON, an operator's token, no --queue). The connection
//! flags are given before the command, as `jobfence --tls-ca … jobs …`.

use jobfence_testkit as kit;

use clap::Parser;
use jobfence_operator::{hoist_connection_flags, Cli, Operation};
use kit::secure::Secure;
use std::ffi::OsString;

/// Runs `jobfence --endpoint … --tls-ca … --token-file … jobs ARGS…` as
/// `who`: what it printed, or that and its error text (with its causes).
pub(crate) async fn jobs(s: &Secure, who: &str, args: &[&str]) -> Result<String, String> {
    let endpoint = format!("https://{}", s.addr);
    let ca = s.files.ca.display().to_string();
    let token = s.files.token(who).display().to_string();
    let mut argv = vec!["jobfence", "--endpoint", &endpoint, "--tls-ca", &ca];
    argv.extend_from_slice(&["--token-file", &token, "jobs"]);
    argv.extend_from_slice(args);
    let argv = hoist_connection_flags(argv.into_iter().map(OsString::from).collect());
    let parsed = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
    let op @ Operation::Jobs(_) = parsed.command else {
        panic!("not a jobs command");
    };
    let mut out = Vec::new();
    let done = jobfence_operator::run(op, &mut out).await;
    let printed = String::from_utf8(out).unwrap();
    done.map_err(|e| format!("{printed}{e:#}"))?;
    Ok(printed)
}

async fn jobs_of_queue(s: &Secure) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT CAST(operation_key AS CHAR), CAST(payload AS CHAR) FROM jobs WHERE queue = 'refunds' ORDER BY id",
    )
    .fetch_all(&s.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn one_job_from_the_terminal_and_the_same_again_is_the_job_it_already_is() {
    let s = Secure::start(false).await;
    let one = [
        "enqueue",
        "--queue",
        "refunds",
        "--key",
        "refund-1",
        "--payload",
        r#"{"amount": 500}"#,
    ];
    let first = jobs(&s, "shop", &one).await.unwrap();
    assert!(first.starts_with("enqueued job "), "{first}");
    assert!(
        first.contains("refund-1") && first.contains("ready"),
        "{first}"
    );
    let again = jobs(&s, "shop", &one).await.unwrap();
    assert!(again.starts_with("already there: job "), "{again}");
    let listed = jobs_of_queue(&s).await;
    assert_eq!(
        listed,
        vec![("refund-1".to_owned(), r#"{"amount": 500}"#.to_owned())]
    );
    s.stop().await;
}

#[tokio::test]
async fn a_file_of_json_lines_goes_through_enqueue_batch_and_a_bad_line_is_named() {
    let s = Secure::start(false).await;
    let dir = std::env::temp_dir().join(format!("jobfence-jobs-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("jobs.jsonl");
    let mut text = String::new();
    for i in 0..1200 {
        text.push_str(&format!(
            "{{\"key\": \"refund-{i}\", \"payload\": {{\"amount\": {i}}}}}\n"
        ));
    }
    // Line 1201: no key. Line 1202: another queue, which `shop` may not use.
    text.push_str("{\"payload\": {}}\n");
    text.push_str("{\"queue\": \"payouts\", \"key\": \"p-1\", \"payload\": {}}\n");
    // Lines 1203 and 1204: a priority and a fairness key the coordinator
    // refuses, each refused alone; line 1205 goes, with both.
    text.push_str("{\"key\": \"bad-1\", \"payload\": {}, \"priority\": 12}\n");
    text.push_str("{\"key\": \"bad-2\", \"payload\": {}, \"fairness_key\": \"  \"}\n");
    text.push_str(
        "{\"key\": \"fair-1\", \"payload\": {}, \"fairness_key\": \"m-1\", \"priority\": 7}\n",
    );
    std::fs::write(&file, text).unwrap();
    let path = file.display().to_string();
    let args = ["enqueue", "--queue", "refunds", "--from", path.as_str()];
    let refused = jobs(&s, "shop", &args).await.unwrap_err();
    assert!(refused.contains("4 line(s) refused"), "{refused}");
    assert!(
        refused.contains("1205 lines read: 1201 enqueued, 0 already there, 4 refused"),
        "{refused}"
    );
    assert!(
        refused.contains("line 1203: \"priority\" must be 1"),
        "{refused}"
    );
    assert!(
        refused.contains("line 1204: \"fairness_key\" must not be blank"),
        "{refused}"
    );
    assert!(refused.contains("line 1201: no \"key\""), "{refused}");
    assert!(
        refused.contains("line 1202: PermissionDenied QUEUE_NOT_ALLOWED"),
        "{refused}"
    );
    assert_eq!(jobs_of_queue(&s).await.len(), 1201);
    // Again, as JSON: nothing twice, the same four lines refused.
    let again = jobs(&s, "shop", &[&args[..], &["--json"]].concat())
        .await
        .unwrap_err();
    assert!(again.contains("4 line(s) refused"), "{again}");
    assert!(again.contains("\"already_there\": 1201"), "{again}");
    assert_eq!(jobs_of_queue(&s).await.len(), 1201);
    let _ = std::fs::remove_dir_all(&dir);
    s.stop().await;
}

#[tokio::test]
async fn bad_input_is_refused_before_anything_is_written() {
    let s = Secure::start(false).await;
    let with = |payload: &'static str| {
        [
            "enqueue",
            "--queue",
            "refunds",
            "--key",
            "refund-1",
            "--payload",
            payload,
        ]
    };
    let not_json = jobs(&s, "shop", &with("{amount: 500")).await.unwrap_err();
    assert!(not_json.contains("--payload is not JSON"), "{not_json}");
    let operator = jobs(&s, "alice", &with("{}")).await.unwrap_err();
    assert!(operator.contains("ROLE_NOT_ALLOWED"), "{operator}");
    let no_queue = jobs(&s, "shop", &["enqueue", "--key", "k", "--payload", "{}"])
        .await
        .unwrap_err();
    assert!(no_queue.contains("--queue is required"), "{no_queue}");
    let no_payload = jobs(&s, "shop", &["enqueue", "--queue", "refunds", "--key", "k"])
        .await
        .unwrap_err();
    assert!(no_payload.contains("--payload"), "{no_payload}");
    assert!(jobs_of_queue(&s).await.is_empty());
    s.stop().await;
}

/// `jobs show` and `jobs list` print each job's priority and fairness key
/// (docs/design.md rule 18), as text and as JSON; a job given none shows
/// the default priority and no key (`-` in the table).
#[tokio::test]
async fn show_and_list_print_the_priority_and_the_fairness_key() {
    let s = Secure::start(false).await;
    let enqueue = |key: &'static str, extra: &'static [&'static str]| {
        let mut args = vec!["enqueue", "--queue", "refunds", "--key", key];
        args.extend_from_slice(&["--payload", "{}", "--json"]);
        args.extend_from_slice(extra);
        let s = &s;
        async move {
            let out = jobs(s, "shop", &args).await.unwrap();
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            v["job_id"].as_u64().unwrap().to_string()
        }
    };
    let fair = enqueue(
        "refund-f1",
        &["--fairness-key", "merchant-7", "--priority", "8"],
    )
    .await;
    let plain = enqueue("refund-f2", &[]).await;

    let shown = jobs(&s, "alice", &["show", &fair, "--json"]).await.unwrap();
    let shown: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(shown["job"]["priority"], 8, "{shown}");
    assert_eq!(shown["job"]["fairness_key"], "merchant-7", "{shown}");
    let text = jobs(&s, "alice", &["show", &fair]).await.unwrap();
    let field = |name: &str| {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name));
        line.unwrap_or_else(|| panic!("no {name}: {text}"))
            .split_whitespace()
            .nth(1)
            .map(str::to_owned)
    };
    assert_eq!(field("priority").as_deref(), Some("8"), "{text}");
    assert_eq!(
        field("fairness_key").as_deref(),
        Some("merchant-7"),
        "{text}"
    );

    let table = jobs(&s, "alice", &["list", "--queue", "refunds"])
        .await
        .unwrap();
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    let at = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (priority, key) = (at("PRIORITY"), at("FAIRNESS_KEY"));
    let row = |id: &str| -> Vec<String> {
        let line = table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(id));
        line.unwrap_or_else(|| panic!("no job {id}: {table}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(
        (&*row(&fair)[priority], &*row(&fair)[key]),
        ("8", "merchant-7"),
        "{table}"
    );
    assert_eq!(
        (&*row(&plain)[priority], &*row(&plain)[key]),
        ("5", "-"),
        "{table}"
    );

    let listed = jobs(&s, "alice", &["list", "--queue", "refunds", "--json"])
        .await
        .unwrap();
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let fields: Vec<(u64, String)> = listed["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            (
                j["priority"].as_u64().unwrap(),
                j["fairness_key"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        fields,
        vec![(8, "merchant-7".to_owned()), (5, String::new())],
        "{listed}"
    );
    s.stop().await;
}

//! Retention through the binary: `jobfence serve` and `jobfence prune`
//! refuse a key retention shorter than the job retention at start, `prune`
//! prunes once with a progress line and says by its exit status when
//! another coordinator holds the pruner's lock, and `serve` prunes on its
//! interval and shows it in /metrics; `prune --prune-archive-dir` writes
//! one archive file and names it in its summary line.

use jobfence_testkit as kit;

use kit::TestDb;
use sqlx::MySqlPool;
use std::process::Stdio;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_jobfence");

/// `n` succeeded jobs finished `days` ago, each with one event.
async fn old_finished_jobs(pool: &MySqlPool, n: usize, days: i64) {
    for i in 0..n {
        let id = sqlx::query(
            "INSERT INTO jobs (queue, operation_key, request_digest, payload, state, attempt, \
             run_at, dispatch_count, provider_reference, created_at, updated_at, finished_at) \
             VALUES ('refunds', ?, UNHEX(SHA2('{}', 256)), '{}', 'succeeded', 1, \
             DATE_SUB(UTC_TIMESTAMP(6), INTERVAL ? DAY), 1, ?, \
             DATE_SUB(UTC_TIMESTAMP(6), INTERVAL ? DAY), DATE_SUB(UTC_TIMESTAMP(6), INTERVAL ? DAY), \
             DATE_SUB(UTC_TIMESTAMP(6), INTERVAL ? DAY))",
        )
        .bind(format!("refund-{i}"))
        .bind(days + 1)
        .bind(format!("re_{i}"))
        .bind(days + 1)
        .bind(days)
        .bind(days)
        .execute(pool)
        .await
        .unwrap()
        .last_insert_id();
        sqlx::query(
            "INSERT INTO job_events (job_id, queue, attempt, kind, from_state, to_state, \
             current_attempt, created_at) \
             VALUES (?, 'refunds', 1, 'completed', 'running', 'succeeded', 1, UTC_TIMESTAMP(6))",
        )
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
    }
}

async fn count(pool: &MySqlPool, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_key_retention_shorter_than_the_job_retention_is_refused_at_start() {
    for command in ["serve", "prune"] {
        let out = tokio::process::Command::new(BIN)
            .args([
                command,
                "--database-url",
                "mysql://nobody@127.0.0.1:1/none",
                "--retention-jobs",
                "30d",
                "--retention-keys",
                "7d",
            ])
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{command}: {stderr}");
        assert!(
            stderr.contains("keys must be kept at least as long as jobs"),
            "{command}: {stderr}"
        );
    }
}

#[tokio::test]
async fn prune_runs_once_with_progress_and_leaves_a_held_lock_alone() {
    let db = TestDb::new().await;
    let pool = db.pool();
    old_finished_jobs(&pool, 3, 31).await;
    let prune = || {
        tokio::process::Command::new(BIN)
            .args(["prune", "--database-url", &db.url, "--prune-batch", "2"])
            .output()
    };

    let mut holder = pool.acquire().await.unwrap();
    sqlx::query("DO GET_LOCK(CONCAT('jobfence_pruner.', LEFT(DATABASE(), 48)), 0)")
        .execute(&mut *holder)
        .await
        .unwrap();
    let out = prune().await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{stdout}");
    assert!(
        stdout.contains("another coordinator is pruning it"),
        "{stdout}"
    );
    assert_eq!(count(&pool, "jobs").await, 3);
    sqlx::query("DO RELEASE_LOCK(CONCAT('jobfence_pruner.', LEFT(DATABASE(), 48)))")
        .execute(&mut *holder)
        .await
        .unwrap();

    let out = prune().await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("database 0: 1 batches, pruned 2 jobs"),
        "a progress line per batch: {stdout}"
    );
    assert!(
        stdout.contains("done: database 0: 2 batches, pruned 3 jobs, 0 observations, 3 events; 3 key records written"),
        "{stdout}"
    );
    assert_eq!(count(&pool, "jobs").await, 0);
    assert_eq!(count(&pool, "operation_keys").await, 3);
}

#[tokio::test]
async fn prune_with_an_archive_dir_writes_one_file_and_names_it() {
    let db = TestDb::new().await;
    let pool = db.pool();
    old_finished_jobs(&pool, 3, 31).await;
    let dir = std::env::temp_dir().join(format!(
        "jobfence-prune-archive-{}-{}",
        std::process::id(),
        db.name
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let out = tokio::process::Command::new(BIN)
        .args(["prune", "--database-url", &db.url, "--prune-batch", "2"])
        .arg("--prune-archive-dir")
        .arg(&dir)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let files: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_str().unwrap();
    assert!(
        name.starts_with("jobfence-prune-") && name.ends_with(&format!("-{}.jsonl.gz", db.name)),
        "{name}"
    );
    let done = stdout
        .lines()
        .find(|l| l.starts_with("done: "))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        done.contains("pruned 3 jobs")
            && done.contains("3 jobs archived")
            && done.ends_with(&format!("; archive {}", files[0].display())),
        "{done}"
    );
    assert_eq!(count(&pool, "jobs").await, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn serve_prunes_on_its_interval_and_shows_it_in_metrics() {
    let db = TestDb::new().await;
    let pool = db.pool();
    old_finished_jobs(&pool, 2, 2).await;
    let mut server = tokio::process::Command::new(BIN)
        .args(["serve", "--insecure", "--database-url", &db.url])
        .args(["--listen", "127.0.0.1:0"])
        .args(["--metrics-listen", "127.0.0.1:0"])
        .args(["--retention-jobs", "1d", "--prune-interval", "200ms"])
        .args(["--pending-refresh-interval", "200ms", "--drain-delay", "0s"])
        .env("JOBFENCE_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let metrics = kit::process::ServeLog::follow(&mut server).metrics().await;
    let mut text = String::new();
    for _ in 0..300 {
        if count(&pool, "jobs").await == 0 {
            if let Ok(body) = reqwest::get(format!("http://{metrics}/metrics")).await {
                text = body.text().await.unwrap_or_default();
                // The key-record gauge is refreshed on its own interval,
                // after the pruning counters: wait for both.
                if text.contains("jobfence_pruned_rows_total{table=\"jobs\"} 2")
                    && text.contains("jobfence_operation_key_records 2")
                {
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(count(&pool, "jobs").await, 0, "serve never pruned");
    assert_eq!(count(&pool, "operation_keys").await, 2);
    for line in [
        "jobfence_pruned_rows_total{table=\"jobs\"} 2",
        "jobfence_pruned_rows_total{table=\"job_events\"} 2",
        "jobfence_operation_key_records 2",
    ] {
        assert!(text.contains(line), "{line} not in:\n{text}");
    }
    let last: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("jobfence_pruner_last_success_timestamp_seconds "))
        .expect("the last-success gauge")
        .parse()
        .unwrap();
    assert!(last > 1.7e9, "{last}");
}

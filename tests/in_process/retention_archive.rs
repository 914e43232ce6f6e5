//! The pruner's archive (`--prune-archive-dir`, issue 19): every pruned
//! job is in the run's gzip'd JSON-lines file exactly once, with its
//! observations and events and the column values it had before pruning;
//! an archive that cannot be written stops the run and deletes nothing.
//! The expected values are read before pruning by SQL of their own
//! (`JSON_OBJECT` over `information_schema.columns`), not by the code
//! under test.

use jobfence_testkit as kit;

use flate2::read::GzDecoder;
use jobfence_api::v1::{
    CompleteRequest, ObservationOutcome, ObservationSource, RecordObservationRequest,
};
use jobfence_core::retention::PrunerSettings;
use jobfence_domain::Retention;
use kit::Harness;
use serde_json::Value;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

const Q: &str = "refunds";
const DAY: Duration = Duration::from_secs(86_400);

fn settings(dir: &Path) -> PrunerSettings {
    PrunerSettings {
        retention: Retention {
            jobs: 30 * DAY,
            keys: None,
        },
        batch: 2,
        rest: 0.0,
        archive_dir: Some(dir.to_path_buf()),
        ..PrunerSettings::defaults()
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "jobfence-archive-test-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A finished job (claimed, one observation, completed) moved `days` back.
async fn finished(h: &Harness, key: &str, days: i64) -> u64 {
    let job = h.enqueue(Q, key, &format!("{{\"key\":\"{key}\"}}")).await;
    let claimed = h.claim_one(Q, "w").await;
    let mut c = h.client.clone();
    c.record_observation(RecordObservationRequest {
        job_id: claimed.job_id,
        attempt: claimed.attempt,
        source: ObservationSource::Worker as i32,
        outcome: ObservationOutcome::Succeeded as i32,
        provider_reference: format!("re_{key}"),
        body: "{\"id\":\"re\"}".into(),
        dedup_key: format!("obs-{key}"),
    })
    .await
    .unwrap();
    c.complete(CompleteRequest {
        job_id: claimed.job_id,
        attempt: claimed.attempt,
        provider_reference: format!("re_{key}"),
        result: "{\"status\":\"ok\"}".into(),
        next: None,
    })
    .await
    .unwrap();
    sqlx::query(
        "UPDATE jobs SET finished_at = DATE_SUB(UTC_TIMESTAMP(6), INTERVAL ? DAY) WHERE id = ?",
    )
    .bind(days)
    .bind(job.job_id)
    .execute(&h.pool)
    .await
    .unwrap();
    job.job_id
}

/// Every row of `table` whose `column` is `id`, as JSON objects built by
/// the database: times as RFC 3339 UTC with microseconds, binary as
/// lowercase hex.
async fn rows_json(h: &Harness, table: &str, column: &str, id: u64) -> Vec<Value> {
    let columns: Vec<(String, String)> = sqlx::query_as(
        "SELECT CAST(column_name AS CHAR), CAST(data_type AS CHAR) FROM information_schema.columns \
         WHERE table_schema = DATABASE() AND table_name = ? ORDER BY ordinal_position",
    )
    .bind(table)
    .fetch_all(&h.pool)
    .await
    .unwrap();
    let fields: Vec<String> = columns
        .iter()
        .map(|(name, ty)| {
            let value = match ty.to_ascii_lowercase().as_str() {
                "datetime" | "timestamp" => {
                    format!("DATE_FORMAT({name}, '%Y-%m-%dT%H:%i:%s.%fZ')")
                }
                "binary" | "varbinary" | "blob" => format!("LOWER(HEX({name}))"),
                _ => name.clone(),
            };
            format!("'{name}', {value}")
        })
        .collect();
    let sql = format!(
        "SELECT CAST(JSON_OBJECT({}) AS CHAR) FROM {table} WHERE {column} = ? ORDER BY id",
        fields.join(", ")
    );
    let rows: Vec<String> = sqlx::query_scalar(&sql)
        .bind(id)
        .fetch_all(&h.pool)
        .await
        .unwrap();
    rows.iter()
        .map(|r| serde_json::from_str(r).unwrap())
        .collect()
}

/// What the archive line of job `id` must be.
async fn expected_line(h: &Harness, id: u64) -> Value {
    let job = rows_json(h, "jobs", "id", id).await;
    assert_eq!(job.len(), 1);
    serde_json::json!({
        "job": job[0],
        "observations": rows_json(h, "job_observations", "job_id", id).await,
        "events": rows_json(h, "job_events", "job_id", id).await,
    })
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut all: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    all.sort();
    all
}

#[tokio::test]
async fn every_pruned_job_is_archived_once_with_its_rows_as_they_were() {
    let h = Harness::start().await;
    let old: Vec<u64> = vec![
        finished(&h, "refund-1", 40).await,
        finished(&h, "refund-2", 35).await,
        finished(&h, "refund-3", 31).await,
    ];
    let young = finished(&h, "refund-4", 2).await;
    let mut expected = Vec::new();
    for id in &old {
        let line = expected_line(&h, *id).await;
        assert!(!line["observations"].as_array().unwrap().is_empty());
        assert!(line["events"].as_array().unwrap().len() >= 3);
        expected.push(line);
    }
    let dir = scratch("ok");
    let report = h
        .coordinator
        .prune_once(&settings(&dir), |_, _| {})
        .await
        .unwrap();
    let total = report.total();
    assert_eq!((total.jobs, total.archived_jobs), (3, 3), "{total:?}");
    assert!(total.batches >= 2, "batches of 2: {total:?}");
    assert!(total.archived_bytes > 0);
    let metrics = h.coordinator.metrics().render();
    assert!(
        metrics.contains("jobfence_pruned_archived_jobs_total 3")
            && metrics.contains(&format!(
                "jobfence_prune_archive_bytes_total {}",
                total.archived_bytes
            )),
        "{metrics}"
    );

    let schema: String = sqlx::query_scalar("SELECT DATABASE()")
        .fetch_one(&h.pool)
        .await
        .unwrap();
    let files = files(&dir);
    assert_eq!(
        files.len(),
        1,
        "one file per run, no .partial left: {files:?}"
    );
    assert_eq!(report.archives, vec![(0, files[0].clone())]);
    let name = files[0].file_name().unwrap().to_str().unwrap().to_string();
    assert!(
        name.starts_with("jobfence-prune-") && name.ends_with(&format!("-{schema}.jsonl.gz")),
        "{name}"
    );
    let mut text = String::new();
    GzDecoder::new(std::fs::File::open(&files[0]).unwrap())
        .read_to_string(&mut text)
        .expect("one valid gzip stream");
    assert!(text.ends_with('\n'));
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(
        lines, expected,
        "each pruned job once, in id order, as it was"
    );
    for id in &old {
        assert_eq!(
            sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM jobs WHERE id = ?")
                .bind(id)
                .fetch_one(&h.pool)
                .await
                .unwrap(),
            0
        );
    }
    assert_eq!(expected_line(&h, young).await["job"]["id"], young);

    // A run with nothing to prune writes no file.
    h.coordinator
        .prune_once(&settings(&dir), |_, _| {})
        .await
        .unwrap();
    assert_eq!(self::files(&dir).len(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn an_archive_that_cannot_be_written_stops_the_run_and_deletes_nothing() {
    let h = Harness::start().await;
    let ids = [
        finished(&h, "refund-1", 40).await,
        finished(&h, "refund-2", 35).await,
    ];
    let count = |sql: &'static str| {
        let pool = h.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let before = (
        count("SELECT COUNT(*) FROM jobs").await,
        count("SELECT COUNT(*) FROM job_observations").await,
        count("SELECT COUNT(*) FROM job_events").await,
        count("SELECT COUNT(*) FROM operation_keys").await,
    );
    let dir = scratch("unwritable");
    let file = dir.join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let err = h
        .coordinator
        .prune_once(&settings(&file.join("archive")), |_, _| {})
        .await
        .expect_err("an unwritable archive stops the run");
    let text = err.to_string();
    assert!(
        text.contains("archive") && text.contains("nothing of it deleted"),
        "{text}"
    );
    let after = (
        count("SELECT COUNT(*) FROM jobs").await,
        count("SELECT COUNT(*) FROM job_observations").await,
        count("SELECT COUNT(*) FROM job_events").await,
        count("SELECT COUNT(*) FROM operation_keys").await,
    );
    assert_eq!(after, before, "nothing deleted, no key record written");
    for id in ids {
        assert_eq!(expected_line(&h, id).await["job"]["id"], id);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// An archive whose write can only finish once another task of the test's
/// runtime has run: it wakes that task, then waits for its answer.
struct NeedsTheRuntime {
    entered: std::sync::Arc<tokio::sync::Notify>,
    answered: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl jobfence_store::archive::PruneArchive for NeedsTheRuntime {
    fn write_batch(&self, lines: &[Vec<u8>]) -> Result<u64, String> {
        self.entered.notify_one();
        let answered = self.answered.lock().unwrap();
        answered
            .recv_timeout(Duration::from_secs(20))
            .map(|()| lines.len() as u64)
            .map_err(|_| "the write blocked the async runtime's only thread".to_string())
    }
}

/// The archive's file work (gzip, fsync) runs on a blocking thread, not on
/// the async runtime that serves the live calls: on a runtime of one
/// thread, a write that needs another task to run still finishes.
#[tokio::test(flavor = "current_thread")]
async fn the_archive_is_written_off_the_async_runtime() {
    let h = Harness::start().await;
    for i in 0..2 {
        finished(&h, &format!("refund-{i}"), 31).await;
    }
    let entered = std::sync::Arc::new(tokio::sync::Notify::new());
    let (tx, rx) = std::sync::mpsc::channel();
    let helper = tokio::spawn({
        let entered = entered.clone();
        async move {
            entered.notified().await;
            tx.send(()).unwrap();
        }
    });
    let archive = std::sync::Arc::new(NeedsTheRuntime {
        entered,
        answered: std::sync::Mutex::new(rx),
    });
    let run = h
        .coordinator
        .store()
        .prune_archived(
            &settings(Path::new(".")).retention,
            500,
            0.0,
            Some(archive),
            |_| {},
        )
        .await
        .expect("the batch's archive write finished");
    assert!(
        matches!(run, jobfence_store::retention::PruneRun::Done(c) if c.jobs == 2 && c.archived_jobs == 2),
        "{run:?}"
    );
    helper.await.unwrap();
    h.finish().await;
}

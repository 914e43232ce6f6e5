//! `jobfence migrate status` and `jobfence migrate --dry-run` on a fresh
//! database (docs/operating.md "Upgrading"): every migration pending, a
//! dry run that lists them and applies nothing, then all applied with
//! their times and checksums ok; `migrate --check` still agrees.

use crate::upgrades::{assert_checks_ok, file_name, jobfence, migration_files, Ran};
use jobfence_testkit::TestDb;

/// `jobfence migrate ARGS --database-url URL`, exit status 0 expected.
async fn migrate(args: &[&str], db: &TestDb) -> Ran {
    let mut all = vec!["migrate"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--database-url", &db.url]);
    let ran = jobfence(&all).await;
    assert!(ran.ok, "{args:?}: {}{}", ran.stdout, ran.stderr);
    ran
}

/// The `migrate status` lines of each migration: (version, the rest).
fn status_lines(stdout: &str) -> Vec<(i64, String)> {
    stdout
        .lines()
        .filter_map(|l| l.trim().split_once("  "))
        .filter_map(|(v, rest)| Some((v.parse().ok()?, rest.trim().to_owned())))
        .collect()
}

#[tokio::test]
async fn migrate_status_and_dry_run_say_what_is_applied_and_what_would_be() {
    let db = TestDb::empty().await;
    let files: Vec<String> = migration_files().iter().map(|f| file_name(f)).collect();
    let versions: Vec<i64> = files
        .iter()
        .map(|f| f.split('_').next().unwrap().parse().unwrap())
        .collect();
    let n = files.len();

    let before = migrate(&["status"], &db).await.stdout;
    let head = format!("database 0: 0 applied, {n} pending");
    assert!(before.starts_with(&head), "{before}");
    let lines = status_lines(&before);
    assert_eq!(lines.iter().map(|l| l.0).collect::<Vec<_>>(), versions);
    assert!(
        lines
            .iter()
            .all(|l| l.1.ends_with(" -                     pending")),
        "{before}"
    );

    let dry = migrate(&["--dry-run"], &db).await.stdout;
    let head = format!(
        "database 0: would apply {n} migration(s): {}",
        files.join(", ")
    );
    assert!(dry.starts_with(&head), "{dry}");
    assert!(dry.ends_with("dry run: nothing applied\n"), "{dry}");
    let still = migrate(&["status"], &db).await.stdout;
    assert_eq!(still, before, "a dry run applies nothing");

    let applied = migrate(&[], &db).await.stdout;
    assert!(
        applied.contains(&format!("applied {n} migration(s)")),
        "{applied}"
    );
    let after = migrate(&["status"], &db).await.stdout;
    let head = format!("database 0: {n} applied, 0 pending");
    assert!(after.starts_with(&head), "{after}");
    let lines = status_lines(&after);
    assert_eq!(lines.iter().map(|l| l.0).collect::<Vec<_>>(), versions);
    assert!(
        lines
            .iter()
            .all(|l| l.1.ends_with("Z  applied, checksum ok")),
        "{after}"
    );
    let dry = migrate(&["--dry-run"], &db).await.stdout;
    assert!(
        dry.contains("up to date") && dry.contains("would apply nothing"),
        "{dry}"
    );
    assert_checks_ok(&db).await;
}

//! Upgrades as an operator meets them, through the real binary
//! (docs/releases.md, docs/operating.md "Upgrading"): a coordinator never
//! serves a schema it does not know, and `jobfence migrate` brings the
//! databases of earlier releases forward.
//!
//! - `jobfence serve` refuses to start on a database with no schema, one
//!   migration behind, with a newer release's migration it does not know
//!   (unless that migration's note says older coordinators may serve beside
//!   it), or with a migration applied from other contents than its file; its
//!   last line names the reason and, where there is one, the remedy, and it
//!   never logs that it serves. `jobfence migrate --check` agrees with it.
//! - A database of release 0.1.0 (its migrations read from git history,
//!   commit e7dbeb3), holding what a 0.1.0 coordinator writes, upgrades with
//!   `jobfence migrate`: the rows stay, and the observations flag's
//!   transition is left open because the database has jobs.
//! - A database migrated at commit c138aaf recorded the checksums of three
//!   migrations edited after their release (since restored byte for byte):
//!   `jobfence migrate` records the restored files' checksums.
//!
//! The history is read with `git` from the checkout; a shallow clone that
//! lacks it fails these tests with a message saying so, never skips them.

use jobfence_testkit::TestDb;
use sha2::{Digest, Sha384};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncBufReadExt;

/// What a coordinator logs once it serves.
const SERVING: &str = "serving jobfence.v1";
/// The line a refused start ends with.
const REFUSING: &str = "jobfence: checking the databases: refusing to serve:";
/// A migration of a release that does not exist yet.
const FUTURE: i64 = 29991231000001;
/// Release 0.1.0.
const RELEASE_0_1_0: &str = "e7dbeb3";
/// The landing before the edited migrations were restored.
const EDITED: &str = "c138aaf";

/// What a command that exited did.
pub(crate) struct Ran {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

/// `jobfence ARGS`, with no database or shards from the environment.
fn command(args: &[&str]) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobfence"));
    c.args(args)
        .env("JOBFENCE_LOG", "info")
        .env_remove("JOBFENCE_SHARDS")
        .env_remove("JOBFENCE_DATABASE_URL")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    c
}

/// `jobfence ARGS` run to its end (at most 120 s).
pub(crate) async fn jobfence(args: &[&str]) -> Ran {
    let child = command(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run jobfence");
    let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("jobfence {args:?} still running after 120 s"))
        .unwrap();
    Ran {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// How a `jobfence serve` ended.
enum Start {
    /// It exited (stderr in `Ran`).
    Exited(Ran),
    /// It logged that it serves (and was killed then): its log so far.
    Served(String),
}

/// `jobfence serve` over `url`, until it exits or logs that it serves
/// (then it is killed); panics when it does neither within 60 s.
async fn serve(url: &str) -> Start {
    let mut child = command(&[
        "serve",
        "--insecure",
        "--listen",
        "127.0.0.1:0",
        "--database-url",
        url,
        "--drain-delay",
        "0s",
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .expect("run jobfence serve");
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    let served = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let serving = line.contains(SERVING);
            seen.push(line);
            if serving {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "jobfence serve neither served nor exited within 60 s:\n{}",
            seen.join("\n")
        )
    });
    if served {
        child.kill().await.unwrap();
        return Start::Served(seen.join("\n"));
    }
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("jobfence serve exits once its stderr closed")
        .unwrap();
    Start::Exited(Ran {
        ok: status.success(),
        stdout: String::new(),
        stderr: seen.join("\n"),
    })
}

/// `jobfence serve` refuses `db` and `jobfence migrate --check` agrees:
/// both name `reason`, and `remedy` when there is one.
async fn assert_refused(db: &TestDb, reason: &str, remedy: Option<&str>) {
    let ran = match serve(&db.url).await {
        Start::Served(log) => panic!("served a database it should refuse ({reason}):\n{log}"),
        Start::Exited(ran) => ran,
    };
    let stderr = &ran.stderr;
    assert!(!ran.ok, "a refused start exits non-zero:\n{stderr}");
    assert!(!stderr.contains(SERVING), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with(REFUSING))
        .unwrap_or_else(|| panic!("no line starting {REFUSING:?}:\n{stderr}"));
    assert!(
        line.contains(reason),
        "it should name {reason:?}:\n{stderr}"
    );
    if let Some(remedy) = remedy {
        assert!(line.contains(remedy), "and {remedy:?}:\n{stderr}");
    }
    let check = jobfence(&["migrate", "--check", "--database-url", &db.url]).await;
    assert!(
        !check.ok,
        "migrate --check should refuse too:\n{}",
        check.stdout
    );
    let refused = check
        .stdout
        .lines()
        .find(|l| l.starts_with("refused: "))
        .unwrap_or_else(|| panic!("no refused: line:\n{}{}", check.stdout, check.stderr));
    assert!(refused.contains(reason), "{refused}");
    if let Some(remedy) = remedy {
        assert!(refused.contains(remedy), "{refused}");
    }
}

/// `jobfence migrate --check` says `db` may be served.
pub(crate) async fn assert_checks_ok(db: &TestDb) -> String {
    let check = jobfence(&["migrate", "--check", "--database-url", &db.url]).await;
    assert!(check.ok, "{}{}", check.stdout, check.stderr);
    assert!(
        check.stdout.starts_with("database 0: ok for jobfence "),
        "{}",
        check.stdout
    );
    check.stdout
}

/// The root of the repository (the root package's directory).
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Today's migration files, oldest first.
pub(crate) fn migration_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("migrations"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sql"))
        .collect();
    files.sort();
    files
}

pub(crate) fn file_name(path: &Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}

/// A directory of its own under the target's scratch directory.
fn scratch(db: &TestDb, what: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{}_{what}", db.name));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Applies the migrations of `dir` (a directory of files as migrations/
/// holds them) with sqlx's own migrator, as an earlier binary did.
async fn migrate_with(db: &TestDb, dir: &Path) {
    let pool = db.pool();
    let migrator = sqlx::migrate::Migrator::new(dir).await.unwrap();
    migrator.run(&pool).await.expect("the migrations apply");
    pool.close().await;
    std::fs::remove_dir_all(dir).unwrap();
}

/// `git ARGS` in the checkout: its standard output, byte for byte. A
/// checkout without the history these tests read fails them, saying so.
fn git(args: &[&str]) -> Vec<u8> {
    let out = std::process::Command::new("git")
        .args(args)
        .current_dir(root())
        .output()
        .unwrap_or_else(|e| panic!("cannot run git {args:?} (this test reads history): {e}"));
    assert!(
        out.status.success(),
        "git {args:?} failed: {}\nThis test reads the migrations of earlier releases from \
         git history (release 0.1.0 is commit {RELEASE_0_1_0}, the landing before the restored \
         migrations {EDITED}); a shallow clone lacks them: run `git fetch --unshallow`.",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    out.stdout
}

/// The migrations of `commit`, written into a new directory.
fn migrations_at(db: &TestDb, commit: &str) -> PathBuf {
    let shallow = git(&["rev-parse", "--is-shallow-repository"]);
    assert_ne!(
        String::from_utf8_lossy(&shallow).trim(),
        "true",
        "this checkout is a shallow clone: the migrations of commit {commit} are read from git \
         history; run `git fetch --unshallow`"
    );
    let dir = scratch(db, commit);
    let listed = git(&["ls-tree", "--name-only", commit, "migrations/"]);
    let paths: Vec<String> = String::from_utf8(listed)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert!(!paths.is_empty(), "no migrations/ at commit {commit}");
    for path in paths {
        let text = git(&["show", &format!("{commit}:{path}")]);
        let name = Path::new(&path).file_name().unwrap();
        std::fs::write(dir.join(name), text).unwrap();
    }
    dir
}

/// The checksum `db` recorded for each migration, by version.
async fn recorded_checksums(db: &TestDb) -> Vec<(i64, Vec<u8>)> {
    let pool = db.pool();
    let rows = sqlx::query_as("SELECT version, checksum FROM _sqlx_migrations ORDER BY version")
        .fetch_all(&pool)
        .await
        .unwrap();
    pool.close().await;
    rows
}

/// SHA-384 of today's file of migration `version`, as sqlx records it.
fn checksum_of_today(version: i64) -> Vec<u8> {
    let file = migration_files()
        .into_iter()
        .find(|p| file_name(p).starts_with(&format!("{version}_")))
        .unwrap_or_else(|| panic!("no file of migration {version} today"));
    Sha384::digest(std::fs::read(file).unwrap()).to_vec()
}

/// Runs `sql` on `db`.
async fn execute(db: &TestDb, sql: &str) {
    let pool = db.pool();
    sqlx::query(sql).execute(&pool).await.unwrap();
    pool.close().await;
}

#[tokio::test]
async fn an_empty_database_is_refused_naming_jobfence_migrate() {
    let db = TestDb::empty().await;
    assert_refused(&db, "no migration applied", Some("`jobfence migrate`")).await;
}

#[tokio::test]
async fn a_database_one_migration_behind_is_refused_naming_the_missing_one() {
    let db = TestDb::empty().await;
    let mut files = migration_files();
    let newest = files.pop().unwrap();
    let dir = scratch(&db, "behind");
    for file in &files {
        std::fs::copy(file, dir.join(file_name(file))).unwrap();
    }
    migrate_with(&db, &dir).await;
    let missing = file_name(&newest);
    assert_refused(&db, &missing, Some("`jobfence migrate`")).await;
}

#[tokio::test]
async fn a_newer_releases_migration_is_served_only_when_its_note_says_may_serve() {
    let db = TestDb::new().await;
    execute(
        &db,
        &format!(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, \
             execution_time) VALUES ({FUTURE}, 'from the future', 1, UNHEX(REPEAT('cd', 48)), 0)"
        ),
    )
    .await;
    let unknown = format!("{FUTURE}_from_the_future.sql");
    // No note: taken as must_stop.
    assert_refused(&db, &unknown, None).await;
    // A note that says older coordinators must stop: refused with its why.
    execute(
        &db,
        &format!(
            "INSERT INTO schema_migration_notes (version, older_coordinators, note) \
             VALUES ({FUTURE}, 'must_stop', 'drops a column older coordinators write')"
        ),
    )
    .await;
    assert_refused(&db, "drops a column older coordinators write", None).await;
    // One that says they may serve beside it: served.
    execute(
        &db,
        &format!(
            "UPDATE schema_migration_notes SET older_coordinators = 'may_serve', \
             note = 'adds a table older coordinators never read' WHERE version = {FUTURE}"
        ),
    )
    .await;
    match serve(&db.url).await {
        Start::Served(_) => {}
        Start::Exited(ran) => panic!("refused a may_serve migration:\n{}", ran.stderr),
    }
    let ok = assert_checks_ok(&db).await;
    assert!(ok.contains(&unknown) && ok.contains("may_serve"), "{ok}");
}

#[tokio::test]
async fn a_modified_migration_is_refused_naming_its_file() {
    let db = TestDb::new().await;
    let file = migration_files()
        .into_iter()
        .find(|p| file_name(p).starts_with("20261201000001_"))
        .expect("the operator indexes' migration");
    execute(
        &db,
        "UPDATE _sqlx_migrations SET checksum = UNHEX(REPEAT('ab', 48)) \
         WHERE version = 20261201000001",
    )
    .await;
    assert_refused(&db, &file_name(&file), None).await;
    // `jobfence migrate` refuses it too, and changes nothing.
    let ran = jobfence(&["migrate", "--database-url", &db.url]).await;
    assert!(!ran.ok, "{}{}", ran.stdout, ran.stderr);
    assert!(ran.stderr.contains(&file_name(&file)), "{}", ran.stderr);
    let recorded = recorded_checksums(&db).await;
    assert!(recorded.contains(&(20261201000001, vec![0xab; 48])));
}

/// What a coordinator of 0.1.0 leaves in its database: a job running
/// under its first attempt, a worker's observation of it, its events.
async fn insert_as_0_1_0(db: &TestDb) {
    let pool = db.pool();
    sqlx::query(
        "INSERT INTO jobs (queue, operation_key, request_digest, payload, state, attempt, \
         run_at, lease_until, lease_owner, first_dispatched_at, dispatch_count, created_at, \
         updated_at) VALUES ('refunds', 'refund-0.1.0', UNHEX(SHA2('refund-0.1.0', 256)), \
         '{\"amount\":100}', 'running', 1, UTC_TIMESTAMP(6), \
         UTC_TIMESTAMP(6) + INTERVAL 30 SECOND, 'worker-a', UTC_TIMESTAMP(6), 1, \
         UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO job_observations (job_id, attempt, source, outcome, provider_reference, \
         body, dedup_key, recorded_at) SELECT id, 1, 'worker', 'succeeded', 're_1', '{}', \
         'worker-saw', UTC_TIMESTAMP(6) FROM jobs WHERE operation_key = 'refund-0.1.0'",
    )
    .execute(&pool)
    .await
    .unwrap();
    for (kind, from, to) in [
        ("enqueued", None, "ready"),
        ("claimed", Some("ready"), "running"),
    ] {
        sqlx::query(
            "INSERT INTO job_events (job_id, queue, attempt, kind, from_state, to_state, \
             current_attempt, created_at) SELECT id, queue, attempt, ?, ?, ?, attempt, \
             UTC_TIMESTAMP(6) FROM jobs WHERE operation_key = 'refund-0.1.0'",
        )
        .bind(kind)
        .bind(from)
        .bind(to)
        .execute(&pool)
        .await
        .unwrap();
    }
    pool.close().await;
}

/// The job `insert_as_0_1_0` wrote (state, attempt, has_observations),
/// and whether the observations flag's transition is complete.
async fn after_upgrade(db: &TestDb) -> ((String, i64, i64), bool) {
    let pool = db.pool();
    let job = sqlx::query_as(
        "SELECT CAST(state AS CHAR), CAST(attempt AS SIGNED), CAST(has_observations AS SIGNED) \
         FROM jobs WHERE operation_key = 'refund-0.1.0'",
    )
    .fetch_one(&pool)
    .await
    .expect("the job of 0.1.0 is still there");
    let complete: i64 = sqlx::query_scalar(
        "SELECT CAST(completed_at IS NOT NULL AS SIGNED) FROM schema_transitions \
         WHERE name = 'observations_flag'",
    )
    .fetch_one(&pool)
    .await
    .expect("the observations flag's transition");
    pool.close().await;
    (job, complete != 0)
}

#[tokio::test]
async fn a_database_of_release_0_1_0_upgrades_with_jobfence_migrate() {
    let db = TestDb::empty().await;
    let old = migrations_at(&db, RELEASE_0_1_0);
    let released = std::fs::read_dir(&old).unwrap().count();
    migrate_with(&db, &old).await;
    insert_as_0_1_0(&db).await;
    assert_refused(&db, "lacks migration", Some("`jobfence migrate`")).await;

    let ran = jobfence(&["migrate", "--database-url", &db.url]).await;
    assert!(ran.ok, "{}{}", ran.stdout, ran.stderr);
    let pending = migration_files().len() - released;
    assert!(
        ran.stdout
            .contains(&format!("database 0: applied {pending} migration(s): ")),
        "{}",
        ran.stdout
    );
    assert_checks_ok(&db).await;
    let (job, complete) = after_upgrade(&db).await;
    // Flagged by migration 20261210000001, which flags the jobs observed
    // before it.
    assert_eq!(job, ("running".to_owned(), 1, 1));
    assert!(
        !complete,
        "a database with jobs leaves the observations flag's transition open"
    );
    // Today's binary serves it.
    if let Start::Exited(ran) = serve(&db.url).await {
        panic!("the upgraded database was refused:\n{}", ran.stderr);
    }
}

#[tokio::test]
async fn a_database_migrated_at_c138aaf_upgrades_with_its_checksums_repaired() {
    let db = TestDb::empty().await;
    let edited = migrations_at(&db, EDITED);
    migrate_with(&db, &edited).await;
    let before = recorded_checksums(&db).await;
    let edits: Vec<i64> = before
        .iter()
        .filter(|(v, sum)| *sum != checksum_of_today(*v))
        .map(|(v, _)| *v)
        .collect();
    assert_eq!(
        edits,
        [20261203000001, 20261204000001, 20261210000001],
        "the migrations edited after their release, as {EDITED} recorded them"
    );
    assert_refused(&db, "lacks migration", Some("`jobfence migrate`")).await;

    let ran = jobfence(&["migrate", "--database-url", &db.url]).await;
    assert!(ran.ok, "{}{}", ran.stdout, ran.stderr);
    // Every migration from the one c138aaf lacked on.
    let newer = migration_files()
        .iter()
        .filter(|p| file_name(p).as_str() >= "20261213000001")
        .count();
    assert!(
        ran.stdout
            .contains(&format!("applied {newer} migration(s)")),
        "{}",
        ran.stdout
    );
    assert!(
        ran.stderr.contains("recorded the restored checksum"),
        "{}",
        ran.stderr
    );
    let after = recorded_checksums(&db).await;
    assert_eq!(after.len(), migration_files().len());
    for (version, sum) in &after {
        assert_eq!(
            *sum,
            checksum_of_today(*version),
            "migration {version}'s recorded checksum is its file's"
        );
    }
    assert!(after.contains(&(20261203000001, checksum_of_today(20261203000001))));
    assert_checks_ok(&db).await;
    let again = jobfence(&["migrate", "--database-url", &db.url]).await;
    assert!(
        again.ok && again.stdout.contains("database 0: up to date"),
        "{}{}",
        again.stdout,
        again.stderr
    );
}

//! A database's number among the shards, recorded in it at first use and
//! checked at every start: a database given or recorded under another
//! number is refused, one down at start is checked when it answers, a shards
//! file placing anything twice is refused naming both lines, and a refused
//! start records nothing.

use super::*;

#[tokio::test]
async fn a_database_given_under_another_number_is_refused() {
    let s = two_shards().await;
    s.enqueue("refunds", "r-1").await;
    // Database 1 given as database 0, and database 0 (which holds
    // database-0 ids) given as database 2.
    let swapped = JobStore::open(&[s.dbs[1].url.clone()], &Default::default()).unwrap();
    let err = swapped.ensure_shard(0).await.unwrap_err();
    assert!(err.to_string().contains("is shard 1"), "{err}");
    let fresh = TestDb::new().await;
    let used_alone = JobStore::open(std::slice::from_ref(&fresh.url), &Default::default()).unwrap();
    let c = Coordinator::new(used_alone.clone(), kit::test_config());
    let job = enqueue_alone(&c, "alone-1").await;
    assert_eq!(shard_of(job.job.id), 0);
    let err = used_alone.ensure_shard(2).await.unwrap_err();
    assert!(err.to_string().contains("outside its range"), "{err}");
}

/// The number recorded in `db`'s `jobfence_shard` table, if any.
async fn recorded(db: &TestDb) -> Option<u32> {
    let pool = db.pool();
    let n = sqlx::query_scalar("SELECT shard FROM jobfence_shard")
        .fetch_optional(&pool)
        .await
        .unwrap();
    pool.close().await;
    n
}

/// `jobfence ARGS` as a child process: whether it exited successfully,
/// and its stderr. A command still running after 60 s (a coordinator that
/// started serving) is killed and counted as a success.
async fn jobfence(args: &[&str]) -> (bool, String) {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobfence"))
        .args(args)
        .env("JOBFENCE_LOG", "info")
        .env_remove("JOBFENCE_SHARDS")
        .env_remove("JOBFENCE_DATABASE_URL")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run jobfence");
    match tokio::time::timeout(Duration::from_secs(60), child.wait_with_output()).await {
        Ok(out) => {
            let out = out.unwrap();
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        }
        Err(_) => (true, "still running after 60 s".to_owned()),
    }
}

#[tokio::test]
async fn a_database_recorded_under_another_number_is_refused_when_used_alone() {
    // Database 1 of a shards file, given alone (as database 0): its ids
    // would land in database 1's range while the shards file of every
    // other coordinator places the queue on database 0.
    let s = two_shards().await;
    for command in [
        &["migrate", "--database-url", &s.dbs[1].url][..],
        &[
            "serve",
            "--insecure",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            &s.dbs[1].url,
        ],
    ] {
        let (ok, stderr) = jobfence(command).await;
        assert!(!ok, "{} was not refused:\n{stderr}", command[0]);
        assert!(
            stderr.contains("shard 1") && stderr.contains("--shards"),
            "{} should name the number and what to do:\n{stderr}",
            command[0]
        );
    }
    assert_eq!(recorded(&s.dbs[1]).await, Some(1), "left as it was");

    // A database never numbered, used alone, is recorded as database 0,
    // so listing it under another number later is refused.
    let fresh = TestDb::empty().await;
    let (ok, stderr) = jobfence(&["migrate", "--database-url", &fresh.url]).await;
    assert!(ok, "{stderr}");
    assert_eq!(recorded(&fresh).await, Some(0));
    let alone = JobStore::open(std::slice::from_ref(&fresh.url), &Default::default()).unwrap();
    let err = alone.ensure_shard(1).await.unwrap_err();
    assert!(err.to_string().contains("is shard 0"), "{err}");
    // Database 0 itself, alone, is accepted.
    let (ok, stderr) = jobfence(&["migrate", "--database-url", &s.dbs[0].url]).await;
    assert!(ok, "{stderr}");
}

#[tokio::test]
async fn a_database_down_at_start_is_checked_when_it_answers() {
    // Database 1 of a shards file, given alone while it does not answer:
    // the coordinator starts (as it always did with its database down),
    // and refuses to go on serving once the database answers.
    let s = two_shards().await;
    let upstream = kit::url_host_port(&s.dbs[1].url);
    let relay = jobfence_fake_provider::netcut::NetCut::start(upstream)
        .await
        .unwrap();
    relay.cut();
    let via = s.dbs[1]
        .url
        .replace(&upstream.to_string(), &relay.addr.to_string());
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobfence"))
        .args(["serve", "--insecure", "--listen", "127.0.0.1:0"])
        .args(["--database-url", &via])
        .args(["--health-interval", "100ms", "--health-timeout", "100ms"])
        .args(["--drain-delay", "0s"])
        .env("JOBFENCE_LOG", "info")
        .env_remove("JOBFENCE_SHARDS")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    let started = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            seen.push(line);
            if seen.last().unwrap().contains("serving jobfence.v1") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(started, Ok(true), "{}", seen.join("\n"));
    assert!(
        seen.iter().any(|l| l.contains("checked when it does")),
        "{}",
        seen.join("\n")
    );
    relay.restore();
    let status = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            seen.push(line);
        }
        child.wait().await.unwrap()
    })
    .await
    .unwrap_or_else(|_| panic!("still serving:\n{}", seen.join("\n")));
    let all = seen.join("\n");
    assert!(!status.success(), "{all}");
    assert!(all.contains("shard 1") && all.contains("--shards"), "{all}");
    assert_eq!(recorded(&s.dbs[1]).await, Some(1));
}

#[tokio::test]
async fn a_shards_file_placing_anything_twice_is_refused_with_both_lines() {
    let head = "database 0 mysql://a/x\ndatabase 1 mysql://b/x\n";
    let twice = [
        "queue dupq 0\nqueue dupq 1\n",
        "queue dupq 1\nqueue dupq 1\n",
        "prefix dup- 0\nprefix dup- 1\n",
        "default 0\ndefault 1\n",
        "database 2 mysql://c/x\ndatabase 2 mysql://d/x\n",
    ];
    for lines in twice {
        let text = format!("{head}# the same thing twice\n{lines}");
        let err = ShardsConfig::parse(&text).unwrap_err();
        assert!(
            err.contains("line 4") && err.contains("line 5"),
            "{err:?} should name lines 4 and 5 of\n{text}"
        );
    }
    // Different queues, prefixes and databases are no conflict.
    ShardsConfig::parse(&format!(
        "{head}queue a 0\nqueue b 1\nprefix a- 0\nprefix b- 1\ndefault 1\n"
    ))
    .unwrap();

    // The command refuses the file before it connects to anything.
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("shards-twice-{}.conf", std::process::id()));
    std::fs::write(&path, format!("{head}queue dupq 0\nqueue dupq 1\n")).unwrap();
    let (ok, stderr) = jobfence(&["migrate", "--shards", path.to_str().unwrap()]).await;
    let _ = std::fs::remove_file(&path);
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains("line 3") && stderr.contains("line 4"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_refused_start_records_no_number() {
    // A database used alone before databases had numbers: one job (id 1),
    // no `jobfence_shard` row.
    let old = TestDb::new().await;
    let store = JobStore::open(std::slice::from_ref(&old.url), &Default::default()).unwrap();
    let c = Coordinator::new(store.clone(), kit::test_config());
    let job = enqueue_alone(&c, "alone-1").await;
    assert_eq!(job.job.id, 1);
    assert_eq!(recorded(&old).await, None);

    // Listed as database 2 next to a new database 0: refused, and neither
    // database was given a number.
    let fresh = TestDb::new().await;
    let stores = BTreeMap::from([
        (
            0,
            JobStore::open(std::slice::from_ref(&fresh.url), &Default::default()).unwrap(),
        ),
        (2, store.clone()),
    ]);
    let err = Shards::new(stores, Placement::everything_on(0))
        .prepare()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("outside its range"), "{err}");
    assert_eq!((recorded(&fresh).await, recorded(&old).await), (None, None));
    let err = store.ensure_shard(2).await.unwrap_err();
    assert!(err.to_string().contains("outside its range"), "{err}");
    assert_eq!(recorded(&old).await, None);

    // Listed as what it is, database 0, it is accepted.
    store.ensure_shard(0).await.expect("database 0");
    assert_eq!(recorded(&old).await, Some(0));
}

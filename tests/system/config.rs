//! `serve --config FILE` and `jobfence config check` on the real binary
//! (docs/configuration.md "The configuration file"): every kind of
//! mistake refused at start with its line and key, the precedence flag >
//! environment > file > default as `config check` shows it, the password
//! from a file, and a coordinator served from the file alone.

use jobfence_testkit::process::ServeLog;
use jobfence_testkit::TestDb;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `jobfence ARGS` with no JOBFENCE_* setting of the caller's.
fn jobfence(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_jobfence"));
    cmd.args(args);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("JOBFENCE_")) {
        cmd.env_remove(k);
    }
    cmd
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn each_kind_of_mistake_stops_the_start_with_its_line_and_key() {
    let d = dir("config-mistakes");
    let cases = [
        ("unknown", "listen = \"127.0.0.1:0\"\n\nlisen = \"127.0.0.1:1\"\n", ":3: key `lisen`: unknown key"),
        ("type", "# the batch\nmax_claim_batch = \"many\"\n", ":2: key `max_claim_batch`: invalid value 'many'"),
        ("switch", "prune_off = \"yes\"\n", ":1: key `prune_off`: expected true or false, found a string"),
        ("duration", "\ndefault_lease = \"30 parsecs\"\n", ":2: key `default_lease`: invalid value '30 parsecs'"),
        ("unitless", "default_lease = 30\n", ":1: key `default_lease`: invalid value '30' for '--default-lease <DEFAULT_LEASE>': time unit needed"),
        ("list", "listen = [\"a\", \"b\"]\n", ":1: key `listen`: expected one value, found a list"),
        ("section", "[serve]\nlisten = \"x\"\n", ":1: key `serve`: a table or section"),
        ("float", "max_claim_batch = 1e2\n", ":1: key `max_claim_batch`: expected one value, found a float"),
        ("zero", "db_max_connections = 0\n", ":1: key `db_max_connections`: invalid value '0'"),
        ("dash", "default-lease = \"45s\"\n", ":1: key `default-lease`: unknown key"),
        ("syntax", "listen = \"127.0.0.1:0\"\nmigrate = = true\n", ":2: "),
    ];
    for (name, text, want) in cases {
        let path = d.join(format!("{name}.toml"));
        std::fs::write(&path, text).unwrap();
        let shown = format!("{}{want}", path.display());
        let out = jobfence(&["serve", "--insecure", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{name}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(&shown),
            "{name}: want {shown:?} in {}",
            stderr(&out)
        );
        let out = jobfence(&["config", "check"]).arg(&path).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{name}: {}", stderr(&out));
        assert!(stderr(&out).contains(&shown), "{name}: {}", stderr(&out));
    }
    let missing = d.join("missing.toml");
    let out = jobfence(&["serve", "--insecure", "--config"])
        .arg(&missing)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains(&format!(
            "reading the configuration file {}",
            missing.display()
        )),
        "{}",
        stderr(&out)
    );
}

#[test]
fn config_check_shows_flag_over_environment_over_file_over_default_with_secrets_masked() {
    let d = dir("config-precedence");
    let path = d.join("jobfence.toml");
    std::fs::write(
        &path,
        "database_url = \"mysql://jobfence:hunter2@db.internal:3306/jobfence\"\n\
         default_lease = \"45s\"\n\
         max_lease = \"2h\"\n\
         listen = \"127.0.0.1:7000\"\n\
         queue_resend_window = [\"refunds=12h\", \"payouts=1h\"]\n\
         insecure = true\n",
    )
    .unwrap();
    let out = jobfence(&["config", "check"])
        .arg(&path)
        .args(["--", "--listen", "127.0.0.1:7001"])
        .env("JOBFENCE_LISTEN", "127.0.0.1:7002")
        .env("JOBFENCE_MAX_LEASE", "3h")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    let file = path.display();
    for want in [
        "listen = \"127.0.0.1:7001\"  # flag".to_owned(),
        "max_lease = \"3h\"  # environment JOBFENCE_MAX_LEASE".to_owned(),
        format!("default_lease = \"45s\"  # file {file}:2"),
        "min_lease = \"1s\"  # default".to_owned(),
        format!(
            "database_url = \"mysql://jobfence:****@db.internal:3306/jobfence\"  # file {file}:1"
        ),
        format!("queue_resend_window = [\"refunds=12h\", \"payouts=1h\"]  # file {file}:5"),
    ] {
        assert!(
            text.lines().any(|l| l == want),
            "no line {want:?} in:\n{text}"
        );
    }
    assert!(!text.contains("hunter2"), "{text}");
}

/// A coordinator started with nothing but `--config`: the file's listen
/// addresses, and the password from `database_password_file` (the URL has
/// none).
#[tokio::test]
async fn a_coordinator_serves_from_the_file_with_its_password_from_a_file() {
    let db = TestDb::new().await;
    let d = dir("config-serve");
    let mut url = url::Url::parse(&db.url).unwrap();
    let password = url
        .password()
        .expect("the test URL has a password")
        .to_owned();
    url.set_password(None).unwrap();
    std::fs::write(d.join("database-password"), format!("{password}\n")).unwrap();
    let path = d.join("jobfence.toml");
    std::fs::write(
        &path,
        format!(
            "database_url = \"{url}\"\n\
             database_password_file = \"{}\"\n\
             insecure = true\nmigrate = true\nprune_off = true\n\
             listen = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:0\"\n\
             drain_delay = \"0s\"\n",
            d.join("database-password").display()
        ),
    )
    .unwrap();
    let mut child = tokio::process::Command::from(jobfence(&["serve", "--config"]))
        .arg(&path)
        .env("JOBFENCE_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let log = ServeLog::follow(&mut child);
    let grpc = log.grpc().await;
    log.wait_for("database health changed").await;
    assert_eq!(
        crate::drain::grpc_probe(grpc).await.as_deref(),
        Ok("SERVING")
    );
    let _ = child.start_kill();
    let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
}

/// What `serve` refuses after its flags parse (settings that disagree, an
/// address it will not serve the console on, a password file it cannot
/// read) `config check` refuses too, naming the setting.
#[test]
fn config_check_refuses_what_serve_would_refuse_after_parsing() {
    let d = dir("config-semantic");
    let cases = [
        (
            "security",
            "listen = \"127.0.0.1:0\"\n",
            "--insecure explicitly",
        ),
        (
            "retention",
            "retention_jobs = \"30d\"\nretention_keys = \"1d\"\n",
            "retention",
        ),
        ("console", "console_listen = \"0.0.0.0:9465\"\n", "console"),
        (
            "password",
            "database_password_file = \"/nonexistent/pw\"\n",
            "reading the database password file",
        ),
    ];
    for (name, text, want) in cases {
        let path = d.join(format!("{name}.toml"));
        // Each file is refused for its own mistake only.
        let insecure = if name == "security" {
            ""
        } else {
            "insecure = true\n"
        };
        std::fs::write(&path, format!("{insecure}{text}")).unwrap();
        let out = jobfence(&["config", "check"]).arg(&path).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{name}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains("serve would refuse this configuration") && err.contains(want),
            "{name}: {err}"
        );
    }
}

/// `migrate` (and `migrate status`) read the coordinators' file for the
/// database keys, and leave serve's own keys (listen, insecure) alone.
#[tokio::test]
async fn migrate_reaches_the_database_the_file_names() {
    let db = TestDb::new().await;
    let d = dir("config-migrate");
    let mut url = url::Url::parse(&db.url).unwrap();
    let password = url.password().unwrap().to_owned();
    url.set_password(None).unwrap();
    std::fs::write(d.join("pw"), format!("{password}\n")).unwrap();
    let path = d.join("jobfence.toml");
    std::fs::write(
        &path,
        format!(
            "listen = \"127.0.0.1:0\"\ninsecure = true\ndatabase_url = \"{url}\"\n\
             database_password_file = \"{}\"\n",
            d.join("pw").display()
        ),
    )
    .unwrap();
    let out = jobfence(&["migrate", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let out = jobfence(&["migrate", "status", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(" applied, 0 pending") && text.contains("checksum ok"),
        "{text}"
    );
}

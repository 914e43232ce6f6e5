//! A shortened `jobfence demo`, run as the binary, and the reading of its
//! report (for the tests of the root package, which build the binary).

/// What a shortened `jobfence demo` printed.
pub struct DemoRun {
    /// The final report (stdout).
    pub report: String,
    /// Its progress lines (stderr), for failure messages.
    pub progress: String,
    /// Whether it exited 0.
    pub succeeded: bool,
}

/// Runs `jobfence demo` with Rust workers only, 200 refunds, the default
/// failures and `args` (the database among them; a flag given there
/// replaces the default of the same flag here), and checks it ended with
/// `invariant: OK`.
pub async fn run_short_demo(name: &str, args: &[&str]) -> DemoRun {
    let run = run_short_demo_as_is(name, args).await;
    assert!(run.succeeded, "demo failed\n{}", run.context());
    assert_eq!(
        run.report.trim_end().lines().last(),
        Some("invariant: OK"),
        "{}",
        run.context()
    );
    run
}

/// [`run_short_demo`] without asserting how it ended ([`DemoRun::succeeded`]
/// tells).
pub async fn run_short_demo_as_is(name: &str, args: &[&str]) -> DemoRun {
    let work = std::env::temp_dir().join(format!("jobfence-demo-{}-{name}", std::process::id()));
    let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    for (flag, value) in [
        ("--jobs", "200"),
        ("--workers", "2"),
        ("--python-workers", "0"),
        ("--node-workers", "0"),
        ("--max-duration", "150s"),
        ("--seed", "7"),
        ("--work-dir", work.to_str().unwrap()),
    ] {
        if !args.contains(&flag) {
            all.extend([flag.to_owned(), value.to_owned()]);
        }
    }
    let out = tokio::process::Command::new(crate::process::jobfence_bin())
        .arg("demo")
        .args(&all)
        .current_dir(crate::repo())
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("run jobfence demo");
    DemoRun {
        report: String::from_utf8_lossy(&out.stdout).into_owned(),
        progress: String::from_utf8_lossy(&out.stderr).into_owned(),
        succeeded: out.status.success(),
    }
}

impl DemoRun {
    /// The report and the progress, for a failure message.
    pub fn context(&self) -> String {
        format!("report:\n{}\nprogress:\n{}", self.report, self.progress)
    }

    /// The report's line `label` (`provider 429s`, `takeover storm`, …),
    /// without its label.
    pub fn line(&self, label: &str) -> String {
        report_line(&self.report, label)
            .unwrap_or_else(|| panic!("no {label:?} line\n{}", self.context()))
    }

    /// The numbers on the report's line `label`, in order (`0 of 594
    /// requests` is [0, 594]).
    pub fn numbers(&self, label: &str) -> Vec<u64> {
        numbers(&self.line(label))
    }
}

/// The demo report's line `label`, without its label.
pub fn report_line(report: &str, label: &str) -> Option<String> {
    report.lines().find_map(|l| {
        l.trim_start()
            .strip_prefix(label)
            .filter(|rest| rest.starts_with("  "))
            .map(|rest| rest.trim().to_owned())
    })
}

/// The whole numbers in `text`, in order (a decimal point ends one).
pub fn numbers(text: &str) -> Vec<u64> {
    text.split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .map(|w| w.parse().unwrap())
        .collect()
}

//! The Go client (`sdk/go`), built the way scripts/test builds it: offline,
//! in GOPATH mode against Debian's packages (`scripts/go-env` installs
//! them; `sdk/go/tools/go` runs the go command that way; sdk/go/README.md
//! says why). `go vet` and `go test` of the module pass, its files are
//! gofmt-clean, and the checked-in `jobfencepb` is what
//! `sdk/go/tools/generate` makes of `proto/` now.
//!
//! The go binary is `$JOBFENCE_GO` (scripts/test: `scripts/go-env`), or
//! `go`. A missing toolchain fails the test; it never skips.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs a command to completion; panics with its output if it fails.
fn run(what: &str, cmd: &mut Command) -> String {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({})\n--- stdout\n{stdout}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `sdk/go/tools/go ARGS`: the go command on the module, offline.
fn go(args: &[&str]) -> Command {
    let mut cmd = Command::new(repo().join("sdk/go/tools/go"));
    cmd.args(args);
    cmd
}

/// Builds a Go program (a package path of the module, or a file by its
/// absolute path) into `out` and returns `out`. Used by the conformance
/// suite (the agent), the README's worker and the demo's tests.
pub fn build(what: &str, out: &Path) -> PathBuf {
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    run(
        &format!("go build {what}"),
        &mut go(&["build", "-o", out.to_str().unwrap(), what]),
    );
    out.to_owned()
}

#[test]
fn go_vet_and_go_test_of_the_go_client_pass_offline() {
    run("go vet ./...", &mut go(&["vet", "./..."]));
    let test = run("go test ./...", &mut go(&["test", "-count=1", "./..."]));
    assert!(
        test.contains("ok  \tgithub.com/jobfence/jobfence/sdk/go\t"),
        "{test}"
    );
    let listed = run(
        "gofmt -l",
        Command::new("gofmt")
            .arg("-l")
            .arg(repo().join("sdk/go"))
            .arg(repo().join("tests/conformance/agent.go")),
    );
    assert_eq!(listed, "", "files gofmt would change");
}

#[test]
fn the_checked_in_go_stubs_match_a_fresh_generation() {
    let fresh = Path::new(env!("CARGO_TARGET_TMPDIR")).join("go-stubs");
    let _ = std::fs::remove_dir_all(&fresh);
    run(
        "sdk/go/tools/generate",
        Command::new(repo().join("sdk/go/tools/generate")).arg(&fresh),
    );
    let names = |dir: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let checked_in = repo().join("sdk/go/jobfencepb");
    assert_eq!(names(&checked_in), names(&fresh), "the generated files");
    for name in names(&fresh) {
        assert!(
            std::fs::read(checked_in.join(&name)).unwrap()
                == std::fs::read(fresh.join(&name)).unwrap(),
            "sdk/go/jobfencepb/{name} differs from what proto/ generates now: \
             run sdk/go/tools/generate and commit the result"
        );
    }
}

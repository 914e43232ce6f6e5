//! The tests that drive the `jobfence` binary and outside programs (the
//! Python, Node and Go clients, promtool, a browser, grpcurl) beside MariaDB,
//! and those that serve the console. One binary: see docs/development.md.

mod bench_smoke;
mod config;
mod conformance;
mod console_browser;
mod console_security;
mod console_settlement;
mod console_workers;
mod drain;
mod durability;
mod fake_provider;
mod go_sdk;
mod main_job;
mod migrate_status;
mod oncall;
mod outage;
mod package;
mod polyglot_python;
mod prometheus;
mod provider_console;
mod readme_workers;
mod restore;
mod retention;
mod serve;
mod shards;
mod shards_next_job;
mod traces;
mod upgrades;

use jobfence_console::operator::Identity;
use jobfence_testkit::secure::Secure;
use std::path::Path;

/// The fenced code block after `<!-- snippet: NAME -->` in README.md or a
/// page of docs/, as printed (with a final newline). The docs' examples are
/// run from there, so what a reader copies is what was tested; a name must
/// mark exactly one block, so a snippet is never printed twice.
pub fn doc_snippet(name: &str) -> String {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![repo.join("README.md")];
    let mut pages: Vec<_> = std::fs::read_dir(repo.join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    pages.sort();
    files.extend(pages);
    let marker = format!("<!-- snippet: {name} -->");
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (at, _) in text.match_indices(&marker) {
            found.push((file, block_after(&text[at + marker.len()..])));
        }
    }
    match found.as_slice() {
        [(_, code)] => code.clone(),
        [] => panic!("no {marker} in README.md or docs/*.md"),
        many => panic!(
            "{marker} marks {} blocks: {:?}",
            many.len(),
            many.iter().map(|(file, _)| file).collect::<Vec<_>>()
        ),
    }
}

/// The body of the first fenced code block in `text`, with a final newline.
fn block_after(text: &str) -> String {
    let open = text.find("```").expect("a code block after the marker");
    let body = &text[open..];
    let body = &body[body.find('\n').unwrap() + 1..];
    body[..body.find("\n```").expect("the code block ends")].to_owned() + "\n"
}

/// A coordinator with TLS and the callers file, its console beside it
/// acting as the operator `alice` ([`Secure::console`]).
pub async fn with_console() -> Secure {
    Secure::with_companion(Box::new(|listener, security, files| {
        let token = std::fs::read_to_string(files.token("alice")).unwrap();
        let identity =
            Identity::for_coordinator(security.auth.clone(), Some(token.trim().to_owned()))
                .unwrap();
        jobfence_console::companion(listener, identity).unwrap()
    }))
    .await
}

/// The binary serving `db` as scripts/serve runs it: TLS and
/// authentication on, with the throw-away credentials of `jobfence
/// credentials dev` written into `dir/.local/serve` (`dir` made afresh).
/// The process (killed when dropped) and its gRPC address.
pub(crate) async fn as_scripts_serve_runs_it(
    db: &jobfence_testkit::TestDb,
    dir: &std::path::Path,
) -> (tokio::process::Child, String) {
    let bin = env!("CARGO_BIN_EXE_jobfence");
    let _ = std::fs::remove_dir_all(dir);
    let creds = dir.join(".local/serve");
    let out = std::process::Command::new(bin)
        .args(["credentials", "dev"])
        .arg(&creds)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut server = tokio::process::Command::new(bin)
        .args(["serve", "--database-url", &db.url])
        .args(["--listen", "127.0.0.1:0"])
        .arg("--tls-cert")
        .arg(creds.join("server.pem"))
        .arg("--tls-key")
        .arg(creds.join("server-key.pem"))
        .arg("--callers")
        .arg(creds.join("callers"))
        // The default health interval (1 s), as scripts/serve: a ping
        // timeout of 100 ms flapped health on a loaded machine.
        .args(["--drain-delay", "0s"])
        .env("JOBFENCE_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let addr = jobfence_testkit::process::ServeLog::follow(&mut server)
        .grpc()
        .await
        .to_string();
    (server, addr)
}

//! The clients as each registry checks them before it accepts a package,
//! without publishing anything:
//!
//! - Rust: `cargo publish --dry-run` of `jobfence-api` and
//!   `jobfence-worker` together (each packaged, and the worker verified
//!   against the packaged API), and what each `.crate` holds.
//! - Python: `python -m build` (wheel and sdist), `twine check --strict`,
//!   and the wheel installed into a fresh venv runs the README's worker.
//! - Node: `npm pack --dry-run --json` lists what the package needs and
//!   nothing else; `tsc --noEmit --strict` checks `src/index.d.ts` against
//!   `examples/typed.ts`.
//! - Go: `go vet` runs in `go_sdk.rs`.
//!
//! And the versions: the API's is written once (`proto/Cargo.toml`, the
//! crate `jobfence-api`), the clients' once (`[workspace.package]` of the
//! top-level `Cargo.toml`); the copies the other languages' package formats
//! need are held to them here.

use super::*;

/// `version = "…"` of the first `[section]` of a TOML file that has one.
fn toml_version(file: &str, section: &str) -> String {
    let text = std::fs::read_to_string(repo().join(file)).unwrap();
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line == section;
        } else if inside {
            if let Some(v) = line.strip_prefix("version = \"") {
                return v.trim_end_matches('"').to_owned();
            }
        }
    }
    panic!("{file} has no version in {section}");
}

/// The string or number after `prefix` on a line of `file`, up to the
/// first quote, comma or space.
fn value_after(file: &str, prefix: &str) -> String {
    let text = std::fs::read_to_string(repo().join(file)).unwrap();
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("{file} has no line starting with {prefix:?}"));
    line[prefix.len()..]
        .trim_start_matches(['"', '\''])
        .split(['"', '\'', ',', ';', ' '])
        .next()
        .unwrap()
        .to_owned()
}

#[test]
fn versions_are_written_in_one_place() {
    let clients = toml_version("Cargo.toml", "[workspace.package]");
    let api = toml_version("proto/Cargo.toml", "[package]");
    let api_major = api.split('.').next().unwrap().to_owned();
    assert_eq!(api, jobfence_api::VERSION, "the API version is the crate's");
    assert_eq!(api_major, jobfence_api::MAJOR);
    let copies = [
        (
            "sdk/python/pyproject.toml",
            toml_version("sdk/python/pyproject.toml", "[project]"),
        ),
        (
            "sdk/python/src/jobfence_worker/__init__.py",
            value_after(
                "sdk/python/src/jobfence_worker/__init__.py",
                "__version__ = ",
            ),
        ),
        (
            "sdk/node/package.json",
            value_after("sdk/node/package.json", "\"version\": "),
        ),
        (
            "sdk/go/client.go",
            value_after("sdk/go/client.go", "const Version = "),
        ),
    ];
    for (file, version) in copies {
        assert_eq!(
            version, clients,
            "{file}: the client version is [workspace.package]'s of Cargo.toml"
        );
    }
    let majors = [
        (
            "sdk/python/src/jobfence_worker/errors.py",
            value_after("sdk/python/src/jobfence_worker/errors.py", "API_MAJOR = "),
        ),
        (
            "sdk/node/src/errors.js",
            value_after("sdk/node/src/errors.js", "const API_MAJOR = "),
        ),
        (
            "sdk/node/src/index.d.ts",
            value_after(
                "sdk/node/src/index.d.ts",
                "export declare const API_MAJOR: ",
            ),
        ),
        (
            "sdk/go/client.go",
            value_after("sdk/go/client.go", "const APIMajor = "),
        ),
    ];
    for (file, major) in majors {
        assert_eq!(
            major, api_major,
            "{file}: the API major version a client speaks is proto/Cargo.toml's"
        );
    }
}

/// Runs `cargo` with `args` from the top of the checkout, in a target
/// directory of its own (the outer `cargo test` holds the usual one).
async fn cargo(args: &[&str]) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("packaging-target");
    run(
        &format!("cargo {}", args.join(" ")),
        Command::new(cargo)
            .args(args)
            .arg("--target-dir")
            .arg(&target)
            .current_dir(repo()),
    )
    .await
}

#[tokio::test]
async fn the_rust_crates_package_and_pass_a_publish_dry_run() {
    // A checkout with uncommitted changes is allowed: what is checked is
    // the package, not the state of the work tree.
    let api: Vec<String> = cargo(&["package", "--list", "--allow-dirty", "-p", "jobfence-api"])
        .await
        .lines()
        .map(str::to_owned)
        .collect();
    for needed in [
        "Cargo.toml",
        "README.md",
        "build.rs",
        "src/lib.rs",
        "src/codec.rs",
        "jobfence/v1/coordinator.proto",
        "jobfence/v1/admin.proto",
        "jobfence/v1/errors.proto",
    ] {
        assert!(
            api.iter().any(|f| f == needed),
            "jobfence-api lacks {needed}: {api:?}"
        );
    }
    let cargo_files = [
        "Cargo.toml",
        "Cargo.toml.orig",
        "Cargo.lock",
        ".cargo_vcs_info.json",
    ];
    for f in &api {
        assert!(
            cargo_files.contains(&f.as_str())
                || f == "README.md"
                || f == "build.rs"
                || (f.starts_with("src/") && f.ends_with(".rs"))
                || (f.starts_with("jobfence/") && f.ends_with(".proto")),
            "jobfence-api ships {f}, which it does not need"
        );
    }
    let worker: Vec<String> = cargo(&[
        "package",
        "--list",
        "--allow-dirty",
        "-p",
        "jobfence-worker",
    ])
    .await
    .lines()
    .map(str::to_owned)
    .collect();
    for needed in [
        "Cargo.toml",
        "README.md",
        "src/lib.rs",
        "examples/minimal_worker.rs",
    ] {
        assert!(
            worker.iter().any(|f| f == needed),
            "jobfence-worker lacks {needed}: {worker:?}"
        );
    }
    for f in &worker {
        assert!(
            cargo_files.contains(&f.as_str())
                || f == "README.md"
                || ((f.starts_with("src/") || f.starts_with("examples/")) && f.ends_with(".rs")),
            "jobfence-worker ships {f}, which it does not need"
        );
    }
    // Both packaged, each built from its .crate alone (the worker against
    // the packaged API, not the checkout's proto/), as crates.io would
    // take them; nothing is uploaded.
    cargo(&[
        "publish",
        "--dry-run",
        "--allow-dirty",
        "-p",
        "jobfence-api",
        "-p",
        "jobfence-worker",
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_wheel_and_sdist_pass_twine_and_the_wheel_runs_the_readme_worker() {
    let python = std::env::var("JOBFENCE_PYTHON").unwrap_or_else(|_| "python3".into());
    let dir = scratch("packaging-python");
    // A copy of sdk/python/, so the build leaves nothing in the checkout.
    let src = dir.join("src");
    copy_dir(&repo().join("sdk/python"), &src);
    let _ = std::fs::remove_dir_all(src.join("build"));
    let dist = dir.join("dist");
    run(
        "python -m build",
        Command::new(&python)
            .args(["-m", "build", "--outdir"])
            .arg(&dist)
            .arg(&src)
            .env("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
    )
    .await;
    let mut built: Vec<PathBuf> = std::fs::read_dir(&dist)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    built.sort();
    let names: Vec<String> = built
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let version = toml_version("Cargo.toml", "[workspace.package]");
    assert_eq!(
        names,
        vec![
            format!("jobfence_worker-{version}-py3-none-any.whl"),
            format!("jobfence_worker-{version}.tar.gz"),
        ]
    );
    run(
        "twine check --strict",
        Command::new(&python)
            .args(["-m", "twine", "check", "--strict"])
            .args(&built),
    )
    .await;

    // The wheel alone, in a fresh venv (its dependencies from the index).
    let venv = dir.join("venv");
    run(
        "python -m venv",
        Command::new(&python).args(["-m", "venv"]).arg(&venv),
    )
    .await;
    let bin = venv.join("bin");
    run(
        "pip install the wheel",
        Command::new(bin.join("python"))
            .args(["-m", "pip", "install", "--quiet"])
            .arg(&built[0])
            .env("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
    )
    .await;
    let typed = run(
        "the wheel's typing marker and stubs",
        Command::new(bin.join("python"))
            .args([
                "-c",
                "import importlib.resources as r, jobfence_worker as j; \
                 p = r.files('jobfence_worker'); \
                 print(j.__version__, (p / 'py.typed').is_file(), (p / '_proto' / 'coordinator_pb2.pyi').is_file())",
            ])
            .env_remove("PYTHONPATH")
            .current_dir(&dir),
    )
    .await;
    assert_eq!(typed.trim(), format!("{version} True True"));

    let h = Harness::start().await;
    super::run_the_readme_python_worker(&h, &dir, &bin).await;
    h.finish().await;
}

#[tokio::test]
async fn the_node_package_packs_what_it_needs_and_its_declarations_type_check() {
    let pkg = repo().join("sdk/node");
    let packed = run(
        "npm pack --dry-run --json",
        Command::new("npm")
            .args(["pack", "--dry-run", "--json", "--loglevel=error"])
            .current_dir(&pkg),
    )
    .await;
    let packed: serde_json::Value =
        serde_json::from_str(&packed).unwrap_or_else(|e| panic!("npm pack --json: {e}: {packed}"));
    let mut files: Vec<String> = packed[0]["files"]
        .as_array()
        .expect("npm pack lists files")
        .iter()
        .map(|f| f["path"].as_str().unwrap().to_owned())
        .collect();
    files.sort();
    let mut want: Vec<String> = [
        "README.md",
        "package.json",
        "proto/jobfence/v1/admin.proto",
        "proto/jobfence/v1/coordinator.proto",
        "proto/jobfence/v1/errors.proto",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for entry in std::fs::read_dir(pkg.join("src")).unwrap() {
        want.push(format!(
            "src/{}",
            entry.unwrap().file_name().to_string_lossy()
        ));
    }
    want.sort();
    assert_eq!(
        files, want,
        "the package holds its sources, its types and the .proto files, and nothing else"
    );
    assert_eq!(
        packed[0]["version"].as_str(),
        Some(toml_version("Cargo.toml", "[workspace.package]").as_str())
    );

    // The declarations, against a typed example of the public API, as a
    // TypeScript user's compiler reads them (typescript is a dev
    // dependency, installed by scripts/node-env).
    run(
        "npm run typecheck (tsc --noEmit --strict)",
        Command::new("npm")
            .args(["run", "--silent", "typecheck"])
            .current_dir(&pkg),
    )
    .await;
}

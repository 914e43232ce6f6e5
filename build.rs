//! `jobfence --version`: the release and the schema version (the newest
//! migration the binary carries, from migrations/), and in the long
//! version the target, the profile and the features the binary was built
//! with, which only a build script can see. A bug report that pastes it says which binary it is about (a
//! `--no-default-features` binary has no demo, benchmark or fake
//! provider). The proto is compiled once, by the API crate (`proto/`).

fn main() {
    let target = std::env::var("TARGET").unwrap_or_else(|_| "unknown".into());
    let profile = std::env::var("PROFILE").unwrap_or_else(|_| "unknown".into());
    let tools = if std::env::var_os("CARGO_FEATURE_TOOLS").is_some() {
        "tools"
    } else {
        "no tools (serve and operate only)"
    };
    let schema = std::fs::read_dir("migrations")
        .expect("migrations/ beside build.rs")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|name| name.split('_').next()?.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    let version = format!(
        "{} (schema {schema})",
        std::env::var("CARGO_PKG_VERSION").unwrap_or_default()
    );
    println!("cargo:rustc-env=JOBFENCE_VERSION={version}");
    println!("cargo:rustc-env=JOBFENCE_LONG_VERSION={version} ({target}, {profile}; {tools})");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=migrations");
}

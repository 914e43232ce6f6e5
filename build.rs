//! The long version of `jobfence --version`: the target, the profile and
//! the features the binary was built with, which only a build script can
//! see. A bug report that pastes it says which binary it is about (a
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
    println!(
        "cargo:rustc-env=JOBFENCE_LONG_VERSION={} ({target}, {profile}; {tools})",
        std::env::var("CARGO_PKG_VERSION").unwrap_or_default()
    );
    println!("cargo:rerun-if-changed=build.rs");
}

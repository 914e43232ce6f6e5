// `sqlx::migrate!` (crates/store/src/lib.rs) embeds the files of
// migrations/ when this crate is compiled, but Cargo does not know the
// directory is an input: a migration added since the last build would be
// left out of the binary until something else in the crate changed. This
// tells Cargo to rebuild the crate when the directory changes (the advice
// of sqlx's documentation for `migrate!`).
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}

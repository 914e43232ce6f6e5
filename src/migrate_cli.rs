//! `jobfence migrate` and the schema gate every serving command passes
//! first (docs/releases.md, docs/operating.md "Upgrading"): a coordinator
//! never serves a database whose schema it does not know.

use crate::cli::{open_shards, DatabaseArgs};
use anyhow::Context;
use clap::Args;
use jobfence_domain::CoordinatorError;
use jobfence_store::schema::{schema_version, SchemaCheck, RELEASE};
use jobfence_store::shards::Shards;

/// The flags of `jobfence migrate`.
#[derive(Debug, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Apply nothing: say, per database, whether a coordinator of this
    /// binary may serve it (exit status 0) or why not (exit status 1:
    /// migrations missing, a newer release's migration that older
    /// coordinators must not serve beside, a migration applied from other
    /// contents).
    #[arg(long)]
    pub check: bool,
}

/// `jobfence migrate [--check]`: prints a line per database.
pub async fn migrate(args: MigrateArgs) -> anyhow::Result<()> {
    let shards = open_shards(&args.database, Some(process_name("migrate")))?;
    if args.check {
        return check(&shards).await;
    }
    migrate_all(&shards, true).await?;
    crate::cli::prepare(&shards, false, false).await?;
    Ok(())
}

/// Applies the pending migrations of every database, saying what each
/// got (on standard output with `print`, else in the log).
pub async fn migrate_all(shards: &Shards, print: bool) -> anyhow::Result<()> {
    for (n, store) in shards.all() {
        let applied = store
            .migrate(&format!("database {n}"))
            .await
            .map_err(|e| refusing_to("migrate", e))
            .with_context(|| format!("applying migrations to database {n}"))?;
        let line = if applied.is_empty() {
            format!("database {n}: up to date (schema {})", schema_version())
        } else {
            let names: Vec<String> = applied.iter().map(ToString::to_string).collect();
            format!(
                "database {n}: applied {} migration(s): {} (schema now {})",
                applied.len(),
                names.join(", "),
                schema_version()
            )
        };
        if print {
            println!("{line}");
        } else {
            tracing::info!(database = n, applied = applied.len(), "{line}");
        }
    }
    Ok(())
}

/// `migrate --check`.
async fn check(shards: &Shards) -> anyhow::Result<()> {
    let mut refused = 0;
    for (n, store) in shards.all() {
        let checked: SchemaCheck = store
            .check_schema()
            .await
            .with_context(|| format!("reading the migrations of database {n}"))?;
        match checked.refusal(&format!("database {n}")) {
            Some(why) => {
                refused += 1;
                println!("refused: {why}");
            }
            None => println!("{}", accepted(*n, &checked)),
        }
    }
    if refused > 0 {
        anyhow::bail!(
            "a coordinator of jobfence {RELEASE} may not serve {refused} of {} database(s)",
            shards.all().len()
        );
    }
    Ok(())
}

fn accepted(n: u32, checked: &SchemaCheck) -> String {
    let mut line = format!(
        "database {n}: ok for jobfence {RELEASE} (schema {}; the database's newest migration {})",
        schema_version(),
        checked.newest_applied().unwrap_or(0)
    );
    if !checked.unknown.is_empty() {
        let names: Vec<String> = checked
            .unknown
            .iter()
            .map(|u| u.migration.to_string())
            .collect();
        line.push_str(&format!(
            "; a newer release applied {}, each marked may_serve for older coordinators",
            names.join(", ")
        ));
    }
    if !checked.repairable.is_empty() {
        line.push_str("; `jobfence migrate` records the restored checksum of a migration edited after its release");
    }
    line
}

/// The name this process's database sessions register under (see
/// `PoolSettings::process`): the command and the host.
pub fn process_name(command: &str) -> String {
    format!("jobfence {command}@{}", jobfence_core::host_name())
}

/// A schema refusal as the one line a start ends with ("refusing to
/// serve: …"); any other error as it is.
pub fn refusing(e: CoordinatorError) -> anyhow::Error {
    refusing_to("serve", e)
}

/// A schema refusal as "refusing to `what`: …"; any other error as it is.
fn refusing_to(what: &str, e: CoordinatorError) -> anyhow::Error {
    match &e {
        CoordinatorError::InvalidArgument(v) if v.iter().any(|f| f.field == "schema") => {
            let why: Vec<&str> = v.iter().map(|f| f.description.as_str()).collect();
            anyhow::anyhow!("refusing to {what}: {}", why.join("; "))
        }
        _ => anyhow::Error::new(e),
    }
}

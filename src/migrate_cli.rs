//! `jobfence migrate` and the schema gate every serving command passes
//! first (docs/releases.md, docs/operating.md "Upgrading"): a coordinator
//! never serves a database whose schema it does not know.

use crate::cli::{open_shards, DatabaseArgs};
use anyhow::Context;
use clap::{Args, Subcommand};
use jobfence_domain::CoordinatorError;
use jobfence_store::schema::{schema_version, MigrationState, SchemaCheck, RELEASE};
use jobfence_store::shards::Shards;

/// The flags of `jobfence migrate`, or its subcommand `status`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct MigrateArgs {
    #[command(subcommand)]
    pub command: Option<MigrateCommand>,
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Apply nothing: say, per database, whether a coordinator of this
    /// binary may serve it (exit status 0) or why not (exit status 1:
    /// migrations missing, a newer release's migration that older
    /// coordinators must not serve beside, a migration applied from other
    /// contents).
    #[arg(long, conflicts_with = "dry_run")]
    pub check: bool,
    /// Apply nothing: say, per database, which migrations `jobfence
    /// migrate` would apply, or why it would refuse (exit status 1).
    #[arg(long)]
    pub dry_run: bool,
}

/// `jobfence migrate`'s subcommands.
#[derive(Debug, Subcommand)]
pub enum MigrateCommand {
    /// List every migration of each database, oldest first: version,
    /// description, when it was applied (UTC) and whether its checksum is
    /// this binary's file's, or pending; and a newer release's. Applies
    /// nothing.
    Status(MigrateStatusArgs),
}

/// The flags of `jobfence migrate status`.
#[derive(Debug, Args)]
pub struct MigrateStatusArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
}

/// `jobfence migrate [--check | --dry-run]` and `jobfence migrate
/// status`: prints a line per database (and, for `status`, per
/// migration).
pub async fn migrate(args: MigrateArgs) -> anyhow::Result<()> {
    if let Some(MigrateCommand::Status(a)) = args.command {
        let shards = open_shards(&a.database, Some(process_name("migrate status")))?;
        return status(&shards).await;
    }
    let shards = open_shards(&args.database, Some(process_name("migrate")))?;
    if args.check {
        return check(&shards).await;
    }
    if args.dry_run {
        return dry_run(&shards).await;
    }
    migrate_all(&shards, true).await?;
    crate::cli::prepare(&shards, false, false).await?;
    Ok(())
}

/// `migrate status`. Written with `writeln!`, so a reader that closes
/// the pipe (`| head`) ends it with an error, not a panic.
async fn status(shards: &Shards) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout();
    for (n, store) in shards.all() {
        let statuses = store
            .migration_status()
            .await
            .with_context(|| format!("reading the migrations of database {n}"))?;
        let pending = statuses
            .iter()
            .filter(|s| s.state == MigrationState::Pending)
            .count();
        writeln!(
            out,
            "database {n}: {} applied, {pending} pending (this binary's schema {})",
            statuses.len() - pending,
            schema_version()
        )?;
        for s in &statuses {
            let at = s
                .applied_at
                .and_then(|t| chrono::DateTime::from_timestamp(t, 0))
                .map(|t| t.format("%Y-%m-%d %H:%M:%SZ").to_string())
                .unwrap_or_else(|| "-".to_owned());
            writeln!(
                out,
                "  {}  {:<40}  {:<20}  {}",
                s.migration.version,
                s.migration.description,
                at,
                s.state.describe()
            )?;
        }
    }
    Ok(())
}

/// `migrate --dry-run`: what `migrate` would apply to each database.
async fn dry_run(shards: &Shards) -> anyhow::Result<()> {
    let mut refused = 0;
    for (n, store) in shards.all() {
        let checked = store
            .check_schema()
            .await
            .with_context(|| format!("reading the migrations of database {n}"))?;
        if let Some(why) = checked.migrate_refusal(&format!("database {n}")) {
            refused += 1;
            println!("would refuse: {why}");
            continue;
        }
        let mut line = if checked.missing.is_empty() {
            format!(
                "database {n}: up to date (schema {}); would apply nothing",
                schema_version()
            )
        } else {
            let names: Vec<String> = checked.missing.iter().map(ToString::to_string).collect();
            format!(
                "database {n}: would apply {} migration(s): {} (schema would be {})",
                names.len(),
                names.join(", "),
                schema_version()
            )
        };
        if !checked.repairable.is_empty() {
            let names: Vec<String> = checked.repairable.iter().map(ToString::to_string).collect();
            line.push_str(&format!(
                "; would record the restored checksum of {}",
                names.join(", ")
            ));
        }
        println!("{line}");
    }
    println!("dry run: nothing applied");
    if refused > 0 {
        anyhow::bail!(
            "`jobfence migrate` would refuse {refused} of {} database(s)",
            shards.all().len()
        );
    }
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

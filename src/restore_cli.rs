//! `jobfence restore fence`: run once a database was restored from a
//! backup, before any coordinator serves it (docs/design.md rule 17;
//! docs/operating.md "Backup and restore"). The store's part is
//! `crates/store/src/restore.rs`.
//!
//! Like `jobs bulk`, it changes nothing without a word from the operator:
//! `--dry-run` counts what it would move, and without `--yes` it says what
//! it would do and refuses. It refuses too while a coordinator still
//! writes heartbeats to a database (`--force` runs it anyway).

use crate::cli::{open_shards, prepare, DatabaseArgs};
use crate::migrate_cli::process_name;
use anyhow::Context;
use clap::{Args, Subcommand};
use jobfence_store::restore::{epoch_of, StateCounts, DEFAULT_FENCE_BATCH};
use jobfence_store::shards::Shards;
use jobfence_store::JobStore;
use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

/// A heartbeat this young may be a running coordinator's: three times the
/// longest interval between two heartbeats (5 s).
const FRESH: Duration = Duration::from_secs(15);

/// How long heartbeats are watched for one that moves: longer than two
/// intervals between heartbeats of a running coordinator. A row restored
/// from a young backup looks fresh but never moves.
const WATCH: Duration = Duration::from_secs(11);

/// The flags of `jobfence restore`.
#[derive(Debug, Args)]
pub struct RestoreArgs {
    #[command(subcommand)]
    pub command: RestoreCommand,
}

/// What `jobfence restore` does.
#[derive(Debug, Subcommand)]
pub enum RestoreCommand {
    /// After a database was restored from a backup, and before any
    /// coordinator serves it: move every unfinished job (ready, running,
    /// manual_review) to the next restore epoch of its attempt (+2^32),
    /// so that no attempt handed out since the backup is handed out
    /// again; a running job's lease ends now (it is taken over, with
    /// reconcile), a ready job is handed out next as reconcile; the job
    /// and event ids move 2^32 past the largest. Each moved job gets a
    /// `restore_fenced` event. Changes nothing without --yes. Running it
    /// again only moves the epoch further (docs/operating.md, "Backup and
    /// restore").
    Fence(FenceArgs),
}

/// The flags of `jobfence restore fence`.
#[derive(Debug, Args)]
pub struct FenceArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Count the jobs it would move, per database and state; change
    /// nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Move them: every coordinator of these databases is stopped.
    #[arg(long)]
    pub yes: bool,
    /// Run even though a coordinator still writes heartbeats to a
    /// database (one that serves while the fence runs may hand out an
    /// attempt of the old epoch a second time).
    #[arg(long)]
    pub force: bool,
    /// Most jobs per transaction (their row locks are held for that batch
    /// only).
    #[arg(long, default_value_t = DEFAULT_FENCE_BATCH)]
    pub batch: u32,
    /// Your name, recorded in every moved job's event.
    #[arg(long, env = "JOBFENCE_OPERATOR", default_value = "")]
    pub operator: String,
}

/// A progress line on stderr. A closed stderr (`2>&1 | head`) does not
/// stop the fence half-way: the line is dropped.
fn progress(line: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Runs `jobfence restore …`.
pub async fn run(args: RestoreArgs) -> anyhow::Result<()> {
    match args.command {
        RestoreCommand::Fence(args) => fence(args).await,
    }
}

/// `jobfence restore fence`: the plan, the checks, then every database
/// in batches; a progress line per batch on stderr, a line per database
/// on stdout.
async fn fence(args: FenceArgs) -> anyhow::Result<()> {
    let shards = open_shards(&args.database, Some(process_name("restore fence")))?;
    prepare(&shards, false, false).await?;
    let moving = plan(&shards).await?;
    if args.dry_run {
        writeln!(std::io::stdout(), "dry run: nothing changed")?;
        return Ok(());
    }
    anyhow::ensure!(
        args.yes,
        "nothing changed: add --yes to move {moving} job(s), once every coordinator of these databases is stopped (docs/operating.md, \"Backup and restore\"; --dry-run counts them)"
    );
    refuse_live_coordinators(&shards, args.force).await?;
    let mut total = StateCounts::default();
    for (n, store) in shards.all() {
        let moved = fence_database(*n, store, &args)
            .await
            .with_context(|| format!("fencing database {n} (running it again is safe)"))?;
        total.add_all(&moved);
    }
    if shards.all().len() > 1 {
        writeln!(
            std::io::stdout(),
            "done: moved {} job(s) in {} databases ({})",
            total.total(),
            shards.all().len(),
            total.describe()
        )?;
    }
    Ok(())
}

/// Prints what the fence would move in each database; returns how many
/// jobs in all.
async fn plan(shards: &Shards) -> anyhow::Result<u64> {
    let mut moving = 0;
    for (n, store) in shards.all() {
        let found = store
            .unfinished()
            .await
            .with_context(|| format!("counting the unfinished jobs of database {n}"))?;
        moving += found.by_state.total();
        writeln!(
            std::io::stdout(),
            "database {n}: {} unfinished job(s) ({}), highest attempt {} (restore epoch {}): each moves to its attempt + 2^32; job and event ids move 2^32 past the largest",
            found.by_state.total(),
            found.by_state.describe(),
            found.highest_attempt,
            epoch_of(found.highest_attempt)
        )?;
    }
    Ok(moving)
}

/// Refuses (unless `force`) while a coordinator writes heartbeats to one
/// of the databases: fresh ones are watched for [`WATCH`], and those that
/// moved meanwhile are a running coordinator's.
async fn refuse_live_coordinators(shards: &Shards, force: bool) -> anyhow::Result<()> {
    if force {
        progress(format_args!(
            "--force: not checking for running coordinators"
        ));
        return Ok(());
    }
    let mut first = BTreeMap::new();
    for (n, store) in shards.all() {
        let beats = store.heartbeats(FRESH).await?;
        if !beats.is_empty() {
            first.insert(*n, beats);
        }
    }
    if first.is_empty() {
        return Ok(());
    }
    progress(format_args!(
        "heartbeats written within {} seen; watching them for {} (a running coordinator writes one every 5 s at most; a backup's never move)",
        humantime::format_duration(FRESH),
        humantime::format_duration(WATCH)
    ));
    tokio::time::sleep(WATCH).await;
    let mut live = Vec::new();
    for (n, store) in shards.all() {
        let before = first.get(n).cloned().unwrap_or_default();
        for beat in store.heartbeats(FRESH).await? {
            if !before
                .iter()
                .any(|b| b.name == beat.name && b.seen == beat.seen)
            {
                live.push(format!("{} (database {n})", beat.name));
            }
        }
    }
    anyhow::ensure!(
        live.is_empty(),
        "refusing to fence: coordinator(s) {} still write heartbeats: stop every coordinator first (one serving while the fence runs may hand out an attempt of the old epoch a second time), or run with --force",
        live.join(", ")
    );
    Ok(())
}

/// Moves database `n`'s id counters, then fences it batch by batch; the
/// jobs moved, by state.
async fn fence_database(n: u32, store: &JobStore, args: &FenceArgs) -> anyhow::Result<StateCounts> {
    let started = std::time::Instant::now();
    // The ids first: the fence's own events then come after every event
    // a consumer may have read from the lost database.
    let ids = store.move_ids_past_restore(n).await?;
    let (mut after, mut batches, mut highest) = (0, 0u64, 0);
    let mut moved = StateCounts::default();
    while let Some(done) = store.fence_batch(after, args.batch, &args.operator).await? {
        after = done.last_id;
        batches += 1;
        highest = highest.max(done.highest_attempt);
        moved.add_all(&done.by_state);
        progress(format_args!(
            "database {n}: batch {batches}: {} job(s) moved so far, through job id {after} ({:.1} s)",
            moved.total(),
            started.elapsed().as_secs_f64()
        ));
    }
    writeln!(
            std::io::stdout(),
        "done: database {n}: moved {} job(s) to the next restore epoch ({}) in {batches} batch(es), highest attempt now {highest}; new job ids from {}, event ids from {}",
        moved.total(),
        moved.describe(),
        ids.jobs,
        ids.events
    )?;
    Ok(moved)
}

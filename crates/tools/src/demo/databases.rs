//! The demo's databases: one (a single server, or a Galera cluster's nodes
//! with --galera), or several with --shards, each made fresh and migrated.

use super::coordinators::Databases;
use super::QUEUE;
use anyhow::{bail, Context, Result};
use jobfence_store::{self as store, PoolSettings};
use sqlx::mysql::MySqlPool;

/// Makes the demo's databases from `--database-url` (several
/// comma-separated URLs: a Galera cluster's nodes) and `--shards`:
/// what the coordinators are given, a pool on each database for the
/// demo's own reads (with a cluster, through its last node: the first is
/// killed on the way), and the queues (one per database).
pub(super) async fn prepare(
    database_url: &str,
    shards: u32,
) -> Result<(Databases, Vec<MySqlPool>, Vec<String>)> {
    let urls: Vec<String> = database_url
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect();
    let first = urls.first().context("--database-url names no database")?;
    if shards > 1 {
        let mut list = Vec::new();
        let mut pools = Vec::new();
        for k in 0..shards {
            let url = shard_url(first, k);
            pools.push(fresh_database(&url).await?);
            list.push((url, queue_of_shard(k)));
        }
        let queues = list.iter().map(|(_, q)| q.clone()).collect();
        return Ok((Databases::Shards(list), pools, queues));
    }
    let mut pool = fresh_database(first).await?;
    if urls.len() > 1 {
        pool.close().await;
        pool = store::connect(urls.last().expect("several"), &PoolSettings::default())?;
    }
    Ok((
        Databases::Nodes(urls.clone()),
        vec![pool],
        vec![QUEUE.to_owned()],
    ))
}

/// The queue placed on database `k` of a sharded demo.
fn queue_of_shard(k: u32) -> String {
    if k == 0 {
        QUEUE.to_owned()
    } else {
        format!("{QUEUE}-{k}")
    }
}

/// `url` with its database name suffixed `_s{k}` (k > 0).
fn shard_url(url: &str, k: u32) -> String {
    if k == 0 {
        url.to_owned()
    } else {
        format!("{url}_s{k}")
    }
}

/// Drops and creates the demo database `url` names, and migrates it.
async fn fresh_database(url: &str) -> Result<MySqlPool> {
    let (server, db) = url
        .rsplit_once('/')
        .context("the database URL needs a database name")?;
    if db.is_empty() || !db.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        bail!("demo database name {db:?} must be [A-Za-z0-9_]+");
    }
    let admin = MySqlPool::connect(&format!("{server}/"))
        .await
        .with_context(|| {
            format!("connecting to {server} (is MariaDB running? scripts/demo starts it)")
        })?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS `{db}`"))
        .execute(&admin)
        .await?;
    sqlx::query(&format!(
        "CREATE DATABASE `{db}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
    ))
    .execute(&admin)
    .await?;
    admin.close().await;
    let migrating = store::connect(url, &PoolSettings::default())?;
    store::MIGRATOR.run(&migrating).await?;
    migrating.close().await;
    // Sessions opened once the schema is there register as this
    // process's, so the coordinators never take them for an older
    // coordinator's (docs/operating.md "Upgrading").
    Ok(store::connect(url, &PoolSettings::default())?)
}

//! What a coordinator knows of its schema (docs/releases.md,
//! docs/operating.md "Upgrading"): the migrations a database applied, held
//! against the ones this binary carries, before anything is served.
//!
//! - Missing migrations (the binary's, not applied): refused, naming them
//!   and `jobfence migrate`. A coordinator never serves a schema it would
//!   answer INTERNAL on.
//! - Applied migrations the binary does not carry (a newer release
//!   migrated): served only when each says, in `schema_migration_notes`,
//!   that older coordinators may serve beside it.
//! - A checksum that differs from the binary's file: refused, naming the
//!   file, except the comment-only edits of [`KNOWN_EDITS`], which
//!   `migrate` repairs.

use super::{convert_sqlx_err, JobStore, MIGRATOR};
use jobfence_domain::CoordinatorError;
use sqlx::migrate::{Migration, Migrator};
use sqlx::Row;
use std::collections::BTreeMap;

/// This build's release (the workspace version, semver).
pub const RELEASE: &str = env!("CARGO_PKG_VERSION");

/// The newest migration this binary carries: its schema version.
pub fn schema_version() -> i64 {
    MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
}

/// Released migrations whose file was edited in comments after release and
/// later restored (docs/releases.md, 0.2.0): a database migrated while the
/// edited file was on main recorded these SHA-384 checksums (hex). The
/// statements are the same, so `migrate` records the restored file's
/// checksum instead; any other difference is refused.
pub const KNOWN_EDITS: &[(i64, &str)] = &[
    (
        20261203000001,
        "73b15f839c29859e75997c653f2cf5511aa6fbd2e259f75daebfd2e57be64aa2daa854dd1dbd8f7dfa3d0fda37281825",
    ),
    (
        20261204000001,
        "375b4a28c28db32f1034ca4c4c51f0d86dc3b09cc6196eb1f23a72d7723c69fe1ae54bb84999460a162818f0572c2653",
    ),
    (
        20261210000001,
        "3acddd261e9c16880acd956bfbedb31e5f7b6876cc6c13c9d51e75dcbfc60689421abe2addadd793f683bc1ef943bbdd",
    ),
];

/// One migration, by version and description (its file name is
/// `{version}_{description with _}.sql`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationName {
    pub version: i64,
    pub description: String,
}

impl std::fmt::Display for MigrationName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}_{}.sql",
            self.version,
            self.description.replace(' ', "_")
        )
    }
}

/// An applied migration this binary does not carry, with what its note
/// says of older coordinators (None: it has no note, so it is taken as
/// `must_stop`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unknown {
    pub migration: MigrationName,
    pub may_serve: Option<bool>,
    pub note: Option<String>,
}

/// A database's schema held against this binary's migrations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchemaCheck {
    /// Whether sqlx's table exists (false: never migrated).
    pub migrated: bool,
    /// Applied and carried, checksums equal.
    pub applied: Vec<MigrationName>,
    /// Carried, not applied.
    pub missing: Vec<MigrationName>,
    /// Applied, not carried (a newer release's).
    pub unknown: Vec<Unknown>,
    /// Applied with another checksum than the binary's file.
    pub modified: Vec<MigrationName>,
    /// Applied with the checksum of a [`KNOWN_EDITS`] entry.
    pub repairable: Vec<MigrationName>,
    /// Applied but marked unfinished (a migrate that stopped half-way).
    pub failed: Vec<MigrationName>,
}

impl SchemaCheck {
    /// Why a coordinator must not serve this database, in one line, or
    /// None when it may. `database` names it in the message.
    pub fn refusal(&self, database: &str) -> Option<String> {
        let names = |v: &[MigrationName]| {
            v.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        if !self.migrated {
            return Some(format!(
                "{database} has no jobfence schema (no migration applied): run `jobfence migrate` (or `jobfence serve --migrate`)"
            ));
        }
        if !self.failed.is_empty() {
            return Some(format!(
                "{database}: migration {} did not finish (a migrate stopped half-way); repair it by hand from the file, then run `jobfence migrate` again",
                names(&self.failed)
            ));
        }
        if !self.modified.is_empty() {
            return Some(format!(
                "{database}: migration {} was applied with other contents than this binary's file (a released migration was edited): this binary and the database disagree on the schema; run the release that applied it, and report the edit",
                names(&self.modified)
            ));
        }
        let refused: Vec<&Unknown> = self
            .unknown
            .iter()
            .filter(|u| u.may_serve != Some(true))
            .collect();
        if !refused.is_empty() {
            let list = refused
                .iter()
                .map(|u| match &u.note {
                    Some(n) => format!("{} ({n})", u.migration),
                    None => format!("{} (no note: taken as must_stop)", u.migration),
                })
                .collect::<Vec<_>>()
                .join(", ");
            return Some(format!(
                "{database} was migrated by a newer release ({list}) that older coordinators must not serve beside: run jobfence {RELEASE}'s successor that carries it (docs/releases.md)"
            ));
        }
        if !self.missing.is_empty() {
            return Some(format!(
                "{database} lacks migration {}: run `jobfence migrate` (or `jobfence serve --migrate`) with this binary first",
                names(&self.missing)
            ));
        }
        None
    }

    /// Why `jobfence migrate` refuses to apply anything to this database
    /// (a migration modified or unfinished, a newer release's that older
    /// coordinators must not serve beside), in one line, or None when it
    /// may: missing migrations are what it applies.
    pub fn migrate_refusal(&self, database: &str) -> Option<String> {
        SchemaCheck {
            missing: Vec::new(),
            migrated: true,
            ..self.clone()
        }
        .refusal(database)
    }

    /// The newest migration applied, if any.
    pub fn newest_applied(&self) -> Option<i64> {
        self.applied
            .iter()
            .chain(self.repairable.iter())
            .map(|m| m.version)
            .chain(self.unknown.iter().map(|u| u.migration.version))
            .max()
    }
}

/// Compares what a database applied with the binary's migrations.
fn compare(
    carried: &[Migration],
    applied: &[(i64, String, Vec<u8>, bool)],
    notes: &BTreeMap<i64, (String, String)>,
) -> SchemaCheck {
    let mut check = SchemaCheck {
        migrated: true,
        ..SchemaCheck::default()
    };
    let by_version: BTreeMap<i64, &Migration> = carried.iter().map(|m| (m.version, m)).collect();
    for (version, description, checksum, success) in applied {
        let name = MigrationName {
            version: *version,
            description: description.clone(),
        };
        if !success {
            check.failed.push(name);
            continue;
        }
        let Some(mine) = by_version.get(version) else {
            let note = notes.get(version);
            check.unknown.push(Unknown {
                migration: name,
                may_serve: note.map(|(older, _)| older == "may_serve"),
                note: note.map(|(_, n)| n.clone()),
            });
            continue;
        };
        if mine.checksum.as_ref() == checksum.as_slice() {
            check.applied.push(name);
        } else if KNOWN_EDITS
            .iter()
            .any(|(v, hex)| v == version && *hex == to_hex(checksum))
        {
            check.repairable.push(name);
        } else {
            check.modified.push(name);
        }
    }
    let seen: std::collections::HashSet<i64> = applied.iter().map(|a| a.0).collect();
    check.missing = carried
        .iter()
        .filter(|m| !seen.contains(&m.version))
        .map(|m| MigrationName {
            version: m.version,
            description: m.description.to_string(),
        })
        .collect();
    check
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .filter_map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
        .collect()
}

impl JobStore {
    /// This database's schema held against the binary's migrations (see
    /// the module documentation). Reads only.
    ///
    /// Errors: `DatabaseUnavailable` when the database does not answer.
    pub async fn check_schema(&self) -> Result<SchemaCheck, CoordinatorError> {
        let pool = self.pool();
        if !has_table(&pool, "_sqlx_migrations").await? {
            return Ok(SchemaCheck {
                missing: MIGRATOR
                    .iter()
                    .map(|m| MigrationName {
                        version: m.version,
                        description: m.description.to_string(),
                    })
                    .collect(),
                ..SchemaCheck::default()
            });
        }
        let applied: Vec<(i64, String, Vec<u8>, bool)> =
            sqlx::query(include_str!("queries/schema/applied.sql"))
                .fetch_all(&pool)
                .await
                .map_err(convert_sqlx_err)?
                .iter()
                .map(|r| {
                    Ok((
                        r.try_get("version")?,
                        super::rows_text(r, 1)?,
                        r.try_get("checksum")?,
                        r.try_get("success")?,
                    ))
                })
                .collect::<Result<_, sqlx::Error>>()
                .map_err(convert_sqlx_err)?;
        let mut notes = BTreeMap::new();
        if has_table(&pool, "schema_migration_notes").await? {
            for r in sqlx::query(include_str!("queries/schema/notes.sql"))
                .fetch_all(&pool)
                .await
                .map_err(convert_sqlx_err)?
            {
                let version: i64 = r.try_get("version").map_err(convert_sqlx_err)?;
                let older = super::rows_text(&r, 1).map_err(convert_sqlx_err)?;
                let note = super::rows_text(&r, 2).map_err(convert_sqlx_err)?;
                notes.insert(version, (older, note));
            }
        }
        Ok(compare(&MIGRATOR.migrations, &applied, &notes))
    }

    /// Applies the pending migrations on a connection of its own (so no
    /// pooled session predates the schema it registers in), after
    /// recording the restored checksum of each [`KNOWN_EDITS`] migration.
    /// Returns the migrations it applied. `database` names it in a
    /// refusal (`database 0`).
    ///
    /// Errors: `DatabaseUnavailable` when the database does not answer or
    /// a migration fails; a refused schema (modified, unfinished, or a
    /// newer release's incompatible migration) is refused before anything
    /// is applied, as `InvalidArgument` naming it.
    pub async fn migrate(&self, database: &str) -> Result<Vec<MigrationName>, CoordinatorError> {
        let before = self.check_schema().await?;
        if let Some(why) = before.migrate_refusal(database) {
            return Err(schema_refused(why));
        }
        let options = (*self.pool().connect_options()).clone();
        let mut conn = <sqlx::MySqlConnection as sqlx::Connection>::connect_with(&options)
            .await
            .map_err(convert_sqlx_err)?;
        for m in &before.repairable {
            let (_, edited) = KNOWN_EDITS
                .iter()
                .find(|(v, _)| *v == m.version)
                .expect("a repairable migration is a known edit");
            let mine = MIGRATOR
                .iter()
                .find(|c| c.version == m.version)
                .expect("a repairable migration is carried");
            sqlx::query(include_str!("queries/schema/repair_checksum.sql"))
                .bind(mine.checksum.as_ref())
                .bind(m.version)
                .bind(from_hex(edited))
                .execute(&mut conn)
                .await
                .map_err(convert_sqlx_err)?;
            tracing::info!(migration = %m, "recorded the restored checksum of a migration edited after its release (comments only)");
        }
        // A newer release's migrations that older coordinators may serve
        // beside: left as they are.
        let migrator = Migrator {
            migrations: MIGRATOR.migrations.clone(),
            ignore_missing: true,
            locking: true,
            no_tx: false,
        };
        migrator
            .run(&mut conn)
            .await
            .map_err(|e| CoordinatorError::DatabaseUnavailable(format!("migration failed: {e}")))?;
        let _ = sqlx::Connection::close(conn).await;
        Ok(before.missing)
    }
}

/// Where one migration stands in a database (`jobfence migrate status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigrationState {
    /// Applied, and its checksum is this binary's file's.
    Applied,
    /// Carried by this binary, not applied: `jobfence migrate` applies it.
    Pending,
    /// Applied from other contents than this binary's file.
    Modified,
    /// Applied with the checksum of a [`KNOWN_EDITS`] entry:
    /// `jobfence migrate` records the restored one.
    Repairable,
    /// Marked unfinished (a migrate stopped half-way).
    Failed,
    /// A newer release's, not carried by this binary; whether older
    /// coordinators may serve beside it (its note; None: no note).
    Newer(Option<bool>),
}

impl MigrationState {
    /// How `migrate status` shows it.
    pub fn describe(self) -> &'static str {
        match self {
            MigrationState::Applied => "applied, checksum ok",
            MigrationState::Pending => "pending",
            MigrationState::Modified => "applied, CHECKSUM DIFFERS from this binary's file",
            MigrationState::Repairable => {
                "applied, checksum of a known comment-only edit (migrate records the restored one)"
            }
            MigrationState::Failed => "UNFINISHED (a migrate stopped half-way)",
            MigrationState::Newer(Some(true)) => "applied by a newer release (may_serve)",
            MigrationState::Newer(Some(false)) => "applied by a newer release (must_stop)",
            MigrationState::Newer(None) => "applied by a newer release (no note: must_stop)",
        }
    }
}

/// One migration of a database, applied or pending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationStatus {
    pub migration: MigrationName,
    pub state: MigrationState,
    /// When it was applied, in Unix seconds (UTC); None when pending.
    pub applied_at: Option<i64>,
}

impl SchemaCheck {
    /// Every migration of this check, oldest first, with its state;
    /// `applied_at` gives the applied ones' times (Unix seconds).
    pub fn statuses(&self, applied_at: &BTreeMap<i64, i64>) -> Vec<MigrationStatus> {
        let mut all: Vec<(MigrationName, MigrationState)> = Vec::new();
        for (names, state) in [
            (&self.applied, MigrationState::Applied),
            (&self.missing, MigrationState::Pending),
            (&self.modified, MigrationState::Modified),
            (&self.repairable, MigrationState::Repairable),
            (&self.failed, MigrationState::Failed),
        ] {
            all.extend(names.iter().map(|m| (m.clone(), state)));
        }
        all.extend(
            self.unknown
                .iter()
                .map(|u| (u.migration.clone(), MigrationState::Newer(u.may_serve))),
        );
        all.sort_by_key(|(m, _)| m.version);
        all.into_iter()
            .map(|(migration, state)| MigrationStatus {
                applied_at: match state {
                    MigrationState::Pending => None,
                    _ => applied_at.get(&migration.version).copied(),
                },
                migration,
                state,
            })
            .collect()
    }
}

impl JobStore {
    /// Every migration of this database and of this binary, oldest first:
    /// applied (checksum ok or not), pending, or a newer release's; with
    /// when each was applied. Reads only.
    ///
    /// Errors: `DatabaseUnavailable` when the database does not answer.
    pub async fn migration_status(&self) -> Result<Vec<MigrationStatus>, CoordinatorError> {
        let check = self.check_schema().await?;
        let mut applied_at = BTreeMap::new();
        if check.migrated {
            for r in sqlx::query(include_str!("queries/schema/applied_at.sql"))
                .fetch_all(&self.pool())
                .await
                .map_err(convert_sqlx_err)?
            {
                let version: i64 = r.try_get("version").map_err(convert_sqlx_err)?;
                let at: i64 = r.try_get("applied_at").map_err(convert_sqlx_err)?;
                applied_at.insert(version, at);
            }
        }
        Ok(check.statuses(&applied_at))
    }
}

/// A schema a coordinator must not serve: `InvalidArgument` on the field
/// `schema`, so a start stops with it (never retried as an outage).
pub fn schema_refused(why: String) -> CoordinatorError {
    CoordinatorError::InvalidArgument(vec![jobfence_domain::FieldViolation::new("schema", why)])
}

async fn has_table(pool: &sqlx::MySqlPool, table: &str) -> Result<bool, CoordinatorError> {
    let n: i64 = sqlx::query_scalar(include_str!("queries/schema/has_table.sql"))
        .bind(table)
        .fetch_one(pool)
        .await
        .map_err(convert_sqlx_err)?;
    Ok(n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(m: &Migration) -> (i64, String, Vec<u8>, bool) {
        (
            m.version,
            m.description.to_string(),
            m.checksum.to_vec(),
            true,
        )
    }

    #[test]
    fn every_kind_of_difference_is_told_apart() {
        let carried = &MIGRATOR.migrations;
        let mut db: Vec<_> = carried.iter().map(applied).collect();
        let last = db.pop().unwrap();
        assert_eq!(compare(carried, &db, &BTreeMap::new()).missing.len(), 1);
        db.push(last);
        db[0].2[0] ^= 1;
        db.push((29991231000001, "from the future".into(), vec![0; 48], true));
        let mut notes = BTreeMap::new();
        let check = compare(carried, &db, &notes);
        assert_eq!(check.modified.len(), 1);
        let why = check.refusal("database 0").unwrap();
        assert!(why.contains(&check.modified[0].to_string()), "{why}");
        db[0].2[0] ^= 1;
        let why = compare(carried, &db, &notes).refusal("database 0").unwrap();
        assert!(why.contains("29991231000001_from_the_future.sql"), "{why}");
        notes.insert(29991231000001, ("may_serve".into(), "adds a table".into()));
        assert_eq!(compare(carried, &db, &notes).refusal("database 0"), None);
    }

    #[test]
    fn every_migration_has_one_status_in_version_order() {
        let carried = &MIGRATOR.migrations;
        let mut db: Vec<_> = carried.iter().map(applied).collect();
        db.pop();
        db[0].2[0] ^= 1;
        db.push((29991231000001, "from the future".into(), vec![0; 48], true));
        let check = compare(carried, &db, &BTreeMap::new());
        let at: BTreeMap<i64, i64> = db.iter().map(|a| (a.0, 1_700_000_000)).collect();
        let statuses = check.statuses(&at);
        assert_eq!(statuses.len(), carried.len() + 1);
        assert!(statuses
            .windows(2)
            .all(|w| w[0].migration.version < w[1].migration.version));
        assert_eq!(statuses[0].state, MigrationState::Modified);
        let pending = &statuses[carried.len() - 1];
        assert_eq!(
            (pending.state, pending.applied_at),
            (MigrationState::Pending, None)
        );
        let newer = statuses.last().unwrap();
        assert_eq!(newer.state, MigrationState::Newer(None));
        assert_eq!(newer.applied_at, Some(1_700_000_000));
        assert!(check.migrate_refusal("database 0").is_some());
    }

    #[test]
    fn the_known_edits_are_repairable_and_name_carried_migrations() {
        for (version, hex) in KNOWN_EDITS {
            let mine = MIGRATOR.iter().find(|m| m.version == *version).unwrap();
            assert_ne!(to_hex(&mine.checksum), *hex, "the edit was restored");
            let db: Vec<_> = MIGRATOR
                .iter()
                .map(|m| {
                    let mut a = applied(m);
                    if m.version == *version {
                        a.2 = from_hex(hex);
                    }
                    a
                })
                .collect();
            let check = compare(&MIGRATOR.migrations, &db, &BTreeMap::new());
            assert_eq!(check.repairable.len(), 1);
            assert_eq!(check.refusal("d"), None);
        }
    }
}

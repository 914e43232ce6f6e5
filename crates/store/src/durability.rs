//! Reads the database server's durability settings (docs/design.md rule 9); the
//! verdict on them is `domain::durability::assess`.

use super::{convert_sqlx_err, JobStore};
use jobfence_domain::durability::DurabilitySettings;
use jobfence_domain::CoordinatorError;
use sqlx::{Executor, MySqlConnection, Row};

impl JobStore {
    /// The server's global settings that decide whether an acknowledged
    /// commit survives a crash, as the server reports them (the same SQL on
    /// MySQL 8.4 and MariaDB 10.11; a setting the server lacks is `None`;
    /// the Galera provider options only when Galera is on). Two short reads
    /// at most, no locks.
    ///
    /// Errors: `DatabaseUnavailable` when the database cannot be reached,
    /// `Internal` for anything else the server answers.
    pub async fn durability_settings(&self) -> Result<DurabilitySettings, CoordinatorError> {
        let mut conn = self.pool().acquire().await.map_err(convert_sqlx_err)?;
        read_settings(&mut conn).await
    }
}

/// [`JobStore::durability_settings`] on one connection.
pub(crate) async fn read_settings(
    conn: &mut MySqlConnection,
) -> Result<DurabilitySettings, CoordinatorError> {
    // The text protocol: MySQL does not prepare SHOW VARIABLES.
    let rows = conn
        .fetch_all(sqlx::raw_sql(include_str!(
            "queries/server/durability_settings.sql"
        )))
        .await
        .map_err(convert_sqlx_err)?;
    let mut settings = DurabilitySettings::default();
    for row in rows {
        let name = text(&row, 0)?;
        let value = Some(text(&row, 1)?);
        match name.to_ascii_lowercase().as_str() {
            "innodb_flush_log_at_trx_commit" => settings.innodb_flush_log_at_trx_commit = value,
            "log_bin" => settings.log_bin = value,
            "sync_binlog" => settings.sync_binlog = value,
            "wsrep_on" => settings.wsrep_on = value,
            _ => {}
        }
    }
    if settings
        .wsrep_on
        .as_deref()
        .is_some_and(|on| on.eq_ignore_ascii_case("ON"))
    {
        let row = conn
            .fetch_one(sqlx::raw_sql(include_str!(
                "queries/server/galera_provider_options.sql"
            )))
            .await
            .map_err(convert_sqlx_err)?;
        settings.wsrep_provider_options = Some(text(&row, 0)?);
    }
    Ok(settings)
}

/// Column `i` as text, whatever character set the server gives it.
fn text(row: &sqlx::mysql::MySqlRow, i: usize) -> Result<String, CoordinatorError> {
    let bytes: Option<Vec<u8>> = row.try_get(i).map_err(convert_sqlx_err)?;
    Ok(String::from_utf8_lossy(&bytes.unwrap_or_default()).into_owned())
}

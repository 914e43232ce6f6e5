//! The health check's own view of the database: one connection of its own,
//! outside the pools, every check bounded by a timeout. A load balancer
//! must learn within seconds that the database is gone or back; a check
//! that waited for a pooled connection (or reused one that died while the
//! database restarted) would tell it late, or wrong.

use super::durability::read_settings;
use super::JobStore;
use crate::domain::durability::DurabilitySettings;
use crate::domain::CoordinatorError;
use sqlx::mysql::MySqlConnectOptions;
use sqlx::{ConnectOptions, Connection, MySqlConnection};
use std::time::Duration;

/// A connection kept for health checks (see the module docs).
#[derive(Debug)]
pub struct HealthProbe {
    options: MySqlConnectOptions,
    conn: Option<MySqlConnection>,
}

impl JobStore {
    /// A probe to the store's database.
    pub fn health_probe(&self) -> HealthProbe {
        HealthProbe {
            options: (*self.pool.connect_options()).clone(),
            conn: None,
        }
    }
}

impl HealthProbe {
    /// Pings the database (connecting first if needed) and reads its
    /// durability settings, all within `timeout`. Any failure drops the
    /// connection, so the next check starts afresh.
    ///
    /// Errors: `DatabaseUnavailable` when the database does not answer in
    /// time; otherwise what reading the settings returned.
    pub async fn check(
        &mut self,
        timeout: Duration,
    ) -> Result<DurabilitySettings, CoordinatorError> {
        let checked = tokio::time::timeout(timeout, self.check_once()).await;
        let result = match checked {
            Ok(r) => r,
            Err(_) => Err(CoordinatorError::DatabaseUnavailable(format!(
                "no answer within {}",
                humantime::format_duration(timeout)
            ))),
        };
        if matches!(result, Err(CoordinatorError::DatabaseUnavailable(_))) {
            self.conn = None;
        }
        result
    }

    async fn check_once(&mut self) -> Result<DurabilitySettings, CoordinatorError> {
        let conn = match &mut self.conn {
            Some(conn) => conn,
            None => self.conn.insert(
                self.options
                    .connect()
                    .await
                    .map_err(super::convert_sqlx_err)?,
            ),
        };
        conn.ping().await.map_err(super::convert_sqlx_err)?;
        read_settings(conn).await
    }
}

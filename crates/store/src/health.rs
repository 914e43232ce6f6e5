//! The health check's own view of the database: one connection of its own
//! per node, outside the pools, every check bounded by a timeout. A load
//! balancer must learn within seconds that the database is gone or back; a
//! check that waited for a pooled connection (or reused one that died while
//! the database restarted) would tell it late, or wrong.
//!
//! On Galera a node that answers is not enough: outside the primary
//! component it refuses every query on a table (error 1047), so the check
//! also asks it `wsrep_ready`. When the current node fails the check, the
//! probe moves the store to the first other node of its list that passes
//! (see `nodes.rs`); that check still reports the failure, so health is
//! NOT_SERVING until the next check has found the new node ready.

use super::durability::read_settings;
use super::nodes::node_state;
use super::JobStore;
use jobfence_domain::durability::DurabilitySettings;
use jobfence_domain::CoordinatorError;
use sqlx::{ConnectOptions, Connection, MySqlConnection};
use std::time::Duration;

/// Connections kept for health checks, one per node (see the module docs).
#[derive(Debug)]
pub struct HealthProbe {
    store: JobStore,
    conns: Vec<Option<MySqlConnection>>,
}

/// What one node's check found.
struct NodeCheck {
    settings: DurabilitySettings,
    /// Not Galera, or a Galera node that is synced.
    synced: bool,
}

impl JobStore {
    /// A probe to the store's database (every node of it).
    pub fn health_probe(&self) -> HealthProbe {
        HealthProbe {
            store: self.clone(),
            conns: (0..self.nodes.len()).map(|_| None).collect(),
        }
    }
}

impl HealthProbe {
    /// Checks the node the store talks to: pings it (connecting first if
    /// needed), reads its durability settings and, on Galera, whether it is
    /// in the primary component, all within `timeout`. Any failure drops
    /// the connection, so the next check starts afresh.
    ///
    /// With several nodes: a failed check moves the store to the first
    /// other node that passes its own check (and still reports the
    /// failure); a passed check while the store is not on its first node
    /// moves it back to the first node before it that is synced.
    ///
    /// Errors: `DatabaseUnavailable` when the node does not answer in time
    /// or is not ready; otherwise what reading the settings returned.
    pub async fn check(
        &mut self,
        timeout: Duration,
    ) -> Result<DurabilitySettings, CoordinatorError> {
        let current = self.store.current_node();
        match self.check_node(current, timeout).await {
            Ok(found) => {
                for earlier in 0..current {
                    if matches!(self.check_node(earlier, timeout).await, Ok(c) if c.synced) {
                        self.switch(
                            current,
                            earlier,
                            "an earlier node of the list is synced again",
                        );
                        break;
                    }
                }
                Ok(found.settings)
            }
            Err(CoordinatorError::DatabaseUnavailable(why)) => {
                let others = (0..self.conns.len()).filter(|&i| i != current);
                for other in others.collect::<Vec<_>>() {
                    if self.check_node(other, timeout).await.is_ok() {
                        self.switch(current, other, &why);
                        break;
                    }
                }
                Err(CoordinatorError::DatabaseUnavailable(why))
            }
            Err(other) => Err(other),
        }
    }

    fn switch(&self, from: usize, to: usize, why: &str) {
        let nodes = self.store.node_addresses();
        tracing::warn!(
            from = %nodes[from],
            to = %nodes[to],
            reason = %why,
            "moving to another database node"
        );
        self.store.switch_to(to);
    }

    async fn check_node(
        &mut self,
        node: usize,
        timeout: Duration,
    ) -> Result<NodeCheck, CoordinatorError> {
        let checked = tokio::time::timeout(timeout, self.probe_node(node)).await;
        let result = match checked {
            Ok(r) => r,
            Err(_) => Err(CoordinatorError::DatabaseUnavailable(format!(
                "no answer within {}",
                humantime::format_duration(timeout)
            ))),
        };
        if matches!(result, Err(CoordinatorError::DatabaseUnavailable(_))) {
            self.conns[node] = None;
        }
        result
    }

    /// One probe of `node` with no time limit ([`check_node`](Self::check_node) bounds it).
    async fn probe_node(&mut self, node: usize) -> Result<NodeCheck, CoordinatorError> {
        let conn = match &mut self.conns[node] {
            Some(conn) => conn,
            None => {
                let mut fresh = self.store.nodes[node]
                    .connect()
                    .await
                    .map_err(super::convert_sqlx_err)?;
                // Like the pools' sessions: newer coordinators must not
                // take this one for an older coordinator's.
                if let Some(name) = &self.store.settings.process {
                    super::fleet::sessions::remember(&mut fresh, name, &self.store.nodes[node])
                        .await
                        .map_err(super::convert_sqlx_err)?;
                }
                self.conns[node].insert(fresh)
            }
        };
        conn.ping().await.map_err(super::convert_sqlx_err)?;
        let settings = read_settings(conn).await?;
        let galera = settings
            .wsrep_on
            .as_deref()
            .is_some_and(|on| on.eq_ignore_ascii_case("ON"));
        if !galera {
            return Ok(NodeCheck {
                settings,
                synced: true,
            });
        }
        let state = node_state(conn).await?;
        if !state.ready {
            return Err(CoordinatorError::DatabaseUnavailable(format!(
                "Galera node not ready for queries (wsrep_ready=OFF, cluster status {})",
                state.cluster_status
            )));
        }
        Ok(NodeCheck {
            settings,
            synced: state.synced,
        })
    }
}

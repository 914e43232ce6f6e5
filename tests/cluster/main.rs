//! The tests that need more than one database or a load: the Galera
//! cluster (`scripts/galera`), several coordinators behind HAProxy, and
//! the load test. One binary: see docs/development.md.

mod cluster;
mod galera;
mod load;
mod upgrade;
mod upgrade_kit;

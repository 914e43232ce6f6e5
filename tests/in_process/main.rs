//! The tests that need MariaDB only: each serves a coordinator in this
//! process through `jobfence_testkit` and talks to it over real gRPC. This
//! binary links neither the console nor the tools, so changing those
//! relinks nothing here. One binary: see docs/development.md.

mod admin;
mod adversarial;
mod blank_strings;
mod budget_waiters;
mod budgets;
mod bulk_batches;
mod bulk_repair;
mod coalesced_claims;
mod commit_unknown;
mod conflicts;
mod connections;
mod enqueue_batch;
mod events_feed;
mod fairness;
mod fairness_caps;
mod group_commit;
mod held_work;
mod jobs_cli;
mod long_poll;
mod metrics;
mod next_job;
mod next_job_refusals;
mod observations;
mod operator_cli;
mod provider_ops;
mod queue_pause;
mod races;
mod repair_pacing_edges;
mod retention;
mod retention_archive;
mod retry_new_operation;
mod security;
mod seed_scenarios;
mod settlement;
mod settlement_cli;
mod settlement_edges;
mod settlement_exceptions;
mod settlement_input;
mod settlement_matching;
mod settlement_pacing;
mod settlement_races;
mod state_machine_model;
mod state_machine_races;
mod takeover_budget;
mod trends;
mod upgrades;
mod validation;
mod worker_sdk;
mod workers;
mod write_rules;

-- The causal reads of a session on a Galera node (docs/database.md, "Reads
-- after writes"). Sent as text: {sync_wait} is written in as a number.
SET SESSION wsrep_sync_wait = {sync_wait}

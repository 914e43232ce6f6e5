-- Frees the pruner's database lock at the end of a run (closing the
-- session frees it too). {pruner_lock}: as in lock_pruner.sql.
DO RELEASE_LOCK({pruner_lock})

-- Takes the pruner's database lock on the run's own session without
-- waiting: 1 when taken, 0 when another session holds it. {pruner_lock}
-- is retention::PRUNER_LOCK, the lock's name.
SELECT GET_LOCK({pruner_lock}, 0)

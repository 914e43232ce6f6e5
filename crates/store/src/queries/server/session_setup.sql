-- What every session of ours runs first, several statements in one round
-- trip (sent as text). READ COMMITTED: the claim scan with SKIP LOCKED
-- scales far better than under REPEATABLE READ, whose next-key locks make
-- concurrent claims and completes wait on each other, and every decision
-- is taken on rows read with a locking read anyway. Written in by lib.rs:
-- {lock_wait_timeout} (whole seconds) and {autocommit} (0 or 1).
SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED;
SET SESSION innodb_lock_wait_timeout = {lock_wait_timeout};
SET SESSION autocommit = {autocommit}

-- Registrations of this node's sessions that closed, and heartbeats a day
-- old. The process list shows a user its own sessions (the coordinators
-- share one user), of this node only: other nodes forget their own.
DELETE FROM coordinator_sessions
WHERE node = CONCAT(@@hostname, ':', @@port)
  AND connection_id NOT IN (SELECT ID FROM information_schema.PROCESSLIST);
DELETE FROM coordinators
WHERE last_seen_at < UTC_TIMESTAMP(6) - INTERVAL 1 DAY

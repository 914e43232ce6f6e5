-- The session's id (a test kills a paused transaction's session by it).
SELECT CONNECTION_ID()

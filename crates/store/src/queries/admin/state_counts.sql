-- QueueStats: jobs by queue and state (an index-only count, on demand).
SELECT queue, state, COUNT(*) AS n FROM jobs GROUP BY queue, state

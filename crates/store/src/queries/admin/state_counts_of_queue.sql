-- QueueStats of one queue: its jobs by state.
SELECT queue, state, COUNT(*) AS n FROM jobs WHERE queue = ? GROUP BY queue, state

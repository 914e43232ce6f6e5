-- The lock probe over the holes between the contiguous run and the last id
-- read: one range, NOWAIT, so a row still being written by an open
-- transaction fails the probe at once (READ COMMITTED takes no gap locks:
-- it locks, and here meets, existing rows only). Binds: the range's ends,
-- both excluded.
SELECT id FROM job_events WHERE id > ? AND id < ? ORDER BY id FOR UPDATE NOWAIT

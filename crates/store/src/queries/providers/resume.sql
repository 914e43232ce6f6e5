-- ResumeProvider: ends a pause, and a throttle a worker reported. Binds:
-- pause ('none'), reason (NULL), operator, name.
UPDATE providers SET pause = ?, pause_reason = ?, throttled_until = NULL,
    updated_at = UTC_TIMESTAMP(6), updated_by = ?
WHERE name = ?

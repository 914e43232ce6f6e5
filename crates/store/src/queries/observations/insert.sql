-- RecordObservation: evidence only, never a change to the job. The foreign
-- key refuses an unknown job; the unique key (job_id, dedup_key) refuses a
-- repeat.
INSERT INTO job_observations (
    job_id, attempt, source, outcome, provider_reference, body, dedup_key, recorded_at
) VALUES (?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6))

-- One observation of a job by its de-duplication key (unique per job).
SELECT {observation_columns} FROM job_observations WHERE job_id = ? AND dedup_key = ?

-- Manual reviews settlement resolved: the resolution events written under
-- its operator name, of the provider's queues {queues}.
SELECT COUNT(*) AS n FROM job_events
WHERE queue IN ({queues}) AND kind = 'manual_review_resolved' AND detail LIKE ?

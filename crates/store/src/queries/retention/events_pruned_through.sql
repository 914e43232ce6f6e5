-- The events feed's mark: every event id up to this one may have been
-- pruned.
SELECT events_pruned_through FROM pruning_marks WHERE singleton = 1

-- Pruning: every event id up to this one may be gone now; the events feed
-- refuses a cursor below it (never lowered). Binds: the batch's largest
-- event id.
UPDATE pruning_marks SET events_pruned_through = GREATEST(events_pruned_through, ?)
WHERE singleton = 1

-- A queue paused by an operator, whether or not it has a provider
-- (`jobfence queue-policies pause`): its claims hand out nothing until it
-- is resumed, on every coordinator (they all read this row in the claim's
-- transaction). paused_at is NULL while it is not paused.
ALTER TABLE queue_policies
    ADD COLUMN paused_at    DATETIME(6) NULL,
    ADD COLUMN paused_by    VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    ADD COLUMN pause_reason VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL;

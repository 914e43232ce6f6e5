-- The database clock read again (docs/design.md rule 2): a batch that
-- waited long for its row locks stamps its changes with this, not with the
-- time it began.
SELECT UTC_TIMESTAMP(6) AS now

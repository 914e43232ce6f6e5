-- A worker's report of the provider's Retry-After, sent with the Fail's
-- COMMIT: holds the provider's hand-outs until {until}, never shortening
-- a longer hold already stored, and counts the report. Sent as text:
-- {until} and {provider} are written in as literals (see store::literal).
UPDATE providers SET throttled_until = GREATEST(COALESCE(throttled_until, {until}), {until}),
    throttle_reports = throttle_reports + 1
WHERE name = {provider}

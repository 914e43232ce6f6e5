-- How long claims of the provider read its waiters (live.sql): until the
-- latest expiry written. Literals: {provider}, {expires}.
UPDATE providers SET waiters_until = GREATEST(COALESCE(waiters_until, {expires}), {expires})
WHERE name = {provider}

-- Caps per fairness key (docs/design.md rule 18): the arrival time of each
-- candidate key's share of a provider's rate, read in the claim's
-- transaction after the provider's row lock (so it is the latest: every
-- writer of these rows holds that lock). {provider} and {keys} (a JSON
-- array) are literals.
SELECT b.fairness_key, b.tat
FROM JSON_TABLE({keys}, '$[*]' COLUMNS (
         k VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) AS t
STRAIGHT_JOIN fairness_key_budgets b FORCE INDEX (PRIMARY)
  ON b.provider = {provider} AND b.fairness_key = t.k

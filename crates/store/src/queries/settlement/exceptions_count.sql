-- How many exceptions are in the states {states}; of a provider and of a
-- job when given (NULL: any): what exceptions_list.sql cuts at its limit,
-- counted with the same filters.
SELECT COUNT(*) AS matched
FROM settlement_exceptions
WHERE state IN ({states})
  AND (? IS NULL OR provider = ?)
  AND (? IS NULL OR job_id = ?)

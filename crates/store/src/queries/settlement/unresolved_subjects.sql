-- Which of the subjects {subjects} have an exception not resolved: only
-- those need their exceptions looked at when nothing new is raised.
SELECT DISTINCT CAST(subject AS CHAR) AS subject FROM settlement_exceptions
WHERE provider = {provider} AND subject IN ({subjects}) AND state <> 'resolved'

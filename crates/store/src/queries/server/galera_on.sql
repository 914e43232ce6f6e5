-- Whether the server is a Galera node. SHOW rather than @@wsrep_on: a
-- variable the server lacks (MySQL) is an empty answer here, not an error.
SHOW VARIABLES LIKE 'wsrep_on'

-- Where a Galera node stands, from its own status variables (readable
-- outside the primary component too).
SHOW GLOBAL STATUS WHERE Variable_name IN
    ('wsrep_ready', 'wsrep_local_state_comment', 'wsrep_cluster_status')

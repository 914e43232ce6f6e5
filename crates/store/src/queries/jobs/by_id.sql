-- One job by primary key (a plain read).
SELECT {job_columns} FROM jobs WHERE id = ?

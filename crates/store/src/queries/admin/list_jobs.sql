-- ListJobs: keyset paging by ascending id. {filters} is empty or the
-- conditions the filter asks for (queue, states, minimum age, operation key
-- prefix), each with its own placeholders, built by admin/stats.rs.
SELECT {job_columns} FROM jobs WHERE id > ?{filters} ORDER BY id LIMIT ?

-- Reverts 0009_trace_context: the jobs' trace contexts are gone (their
-- attempts start traces of their own), and so are the functions that came
-- with the table: the overload of pgfifo.enqueue that stores a context and
-- the retention's pgfifo.purge_job_traces. No release before 0.3.0 calls
-- them; the nine-argument pgfifo.enqueue stays. (Both look for the table
-- with to_regclass, and keep working without it, until they are dropped.)
DROP FUNCTION IF EXISTS pgfifo.enqueue(text[], text[], text[], jsonb[], smallint[], integer[], text[],
                                       bigint[], bigint[], text[], text[]);
DROP FUNCTION IF EXISTS pgfifo.purge_job_traces(bigint, bigint);
DROP TABLE IF EXISTS pgfifo.job_trace;
-- The function set recorded as installed is no longer what is installed:
-- the next `migrate up` installs it again.
DELETE FROM pgfifo.schema_functions;

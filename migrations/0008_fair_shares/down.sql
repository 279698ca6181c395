-- Reverts 0008_fair_shares: the shares and the functions that keep them go.
-- The functions of the hot path stay: they use shares only while
-- pgfifo.group_share exists, and without it weights have no effect (round
-- robin among ready groups, as in 0.2.0's schema without a runner of
-- 0.2.0's functions) until the next `migrate up`.
DROP FUNCTION IF EXISTS pgfifo.share_candidates(text, smallint, integer, timestamptz);
DROP FUNCTION IF EXISTS pgfifo.rejoin_share(text, text);
DROP FUNCTION IF EXISTS pgfifo.charge_share(text, text, integer, integer);
DROP FUNCTION IF EXISTS pgfifo.share_lag();
DROP FUNCTION IF EXISTS pgfifo.queue_weighted(text);
DROP TABLE IF EXISTS pgfifo.group_share;
-- The SQL API for producers (functions/12_add_job.sql) came with 0.3.0 too,
-- whose schema this reverts to 0.2.0's; 0.2.0 has no caller of it.
DROP FUNCTION IF EXISTS pgfifo.add_jobs(jsonb);
DROP FUNCTION IF EXISTS pgfifo.add_job(text, text, jsonb, text, timestamptz, interval, integer, text, integer, text, text, text, text, interval);
DROP FUNCTION IF EXISTS pgfifo.add_job_traced(text, text, text);
DROP FUNCTION IF EXISTS pgfifo.add_job_interval(text, jsonb, text, text);
DROP FUNCTION IF EXISTS pgfifo.add_job_windowed(text[], text[], text[], jsonb[], smallint[], integer[], text[], bigint[], bigint[], text[], text[], bigint[], text[], text[]);
DROP FUNCTION IF EXISTS pgfifo.add_job_enqueued(text[], text[], text[], jsonb[], smallint[], integer[], text[], bigint[], bigint[], text[], text[], bigint[], text[], text[]);
DROP FUNCTION IF EXISTS pgfifo.add_job_outcome(text, text, jsonb, text, timestamptz, interval, integer, text, integer, text, text, text, text, interval);
-- So did the windows' functions (functions/11_enqueue_window.sql).
DROP FUNCTION IF EXISTS pgfifo.enqueue_outcomes(text[], text[], text[], jsonb[], smallint[], integer[], text[], bigint[], bigint[], text[], text[], bigint[]);
DROP FUNCTION IF EXISTS pgfifo.clean_windows(integer);
DROP FUNCTION IF EXISTS pgfifo.window_of_job(bigint);
DROP FUNCTION IF EXISTS pgfifo.add_job_window_checked(text, text, text, interval, text, timestamptz, interval);
DROP FUNCTION IF EXISTS pgfifo.add_job_checked(text, text, text, jsonb, text, timestamptz, interval, integer, text, integer);
-- The function set recorded as installed is no longer what is installed:
-- the next `migrate up` installs it again.
DELETE FROM pgfifo.schema_functions;

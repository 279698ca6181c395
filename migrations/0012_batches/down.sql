-- Reverts 0012_batches: batches, their jobs' membership and their
-- callbacks go, with the functions that read them (17_batches.sql). The
-- functions of the hot path stay: they call into batches only while
-- pgfifo.batch_job exists. The jobs themselves stay, as ordinary jobs.
DROP FUNCTION IF EXISTS pgfifo.batch_enqueue(bigint, text, boolean, text[], text[], text[], text[], jsonb[], smallint[], integer[], text[], text[], text[], jsonb[], smallint[], integer[], bigint[], bigint[]);
DROP FUNCTION IF EXISTS pgfifo.batch_close(bigint);
DROP FUNCTION IF EXISTS pgfifo.clean_batches(integer);
DROP FUNCTION IF EXISTS pgfifo.batch_outcomes(bigint[], text[]);
DROP FUNCTION IF EXISTS pgfifo.batch_retried(bigint[]);
DROP FUNCTION IF EXISTS pgfifo.batch_settle(bigint);
DROP FUNCTION IF EXISTS pgfifo.batch_count_jobs(bigint, integer, integer);
DROP FUNCTION IF EXISTS pgfifo.batch_count_shards(bigint, integer, integer);
DROP FUNCTION IF EXISTS pgfifo.batch_take(bigint, integer, integer, integer, integer);
DROP FUNCTION IF EXISTS pgfifo.batch_take_spread(bigint, integer, integer, integer, integer, boolean);
DROP FUNCTION IF EXISTS pgfifo.batch_count_outcomes(bigint[], text[]);
DROP FUNCTION IF EXISTS pgfifo.batch_counting(bigint);
DROP FUNCTION IF EXISTS pgfifo.job_batch(bigint);
DROP TABLE IF EXISTS pgfifo.batch_callback;
DROP TABLE IF EXISTS pgfifo.batch_job;
DROP TABLE IF EXISTS pgfifo.batch_shard;
DROP TABLE IF EXISTS pgfifo.batch;
-- The function set recorded as installed is no longer what is installed:
-- the next `migrate up` installs it again.
DELETE FROM pgfifo.schema_functions;

-- Reverts 0007_long_runs. Long runs in progress lose their rows: their
-- jobs are queued heads again and run again (their writes so far stay). Run
-- it with no runner of this release running. The functions of the hot path
-- stay: they look at long runs only while pgfifo.job_run exists.
DROP FUNCTION IF EXISTS pgfifo.claim_long_run(bigint, text, text, integer, text, integer);
DROP FUNCTION IF EXISTS pgfifo.end_long_run(bigint, bigint);
DROP FUNCTION IF EXISTS pgfifo.release_long_run(bigint, bigint);
DROP FUNCTION IF EXISTS pgfifo.renew_long_runs(bigint[], integer);
DROP FUNCTION IF EXISTS pgfifo.long_run_free(text, text, bigint);
DROP FUNCTION IF EXISTS pgfifo.long_run_key(text, text, bigint);
-- Groups marked as held by a long run become ready again.
UPDATE pgfifo.queue_group SET ready_at = now() WHERE ready_at = '-infinity';
DROP TABLE IF EXISTS pgfifo.job_run;
DROP SEQUENCE IF EXISTS pgfifo.job_run_token_seq;
-- The function set recorded as installed is no longer what is installed:
-- the next `migrate up` installs it again.
DELETE FROM pgfifo.schema_functions;

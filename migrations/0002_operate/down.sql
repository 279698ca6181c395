-- Reverts 0002_operate.
DROP FUNCTION IF EXISTS pgfifo.estimate_jobs(text, text);
DROP FUNCTION IF EXISTS pgfifo.clean_groups(timestamptz, integer);
DROP FUNCTION IF EXISTS pgfifo.purge_jobs(timestamptz, text[], bigint, integer);
DROP FUNCTION IF EXISTS pgfifo.set_failure_policy(text, text);
DROP FUNCTION IF EXISTS pgfifo.set_queue_paused(text, boolean);
DROP FUNCTION IF EXISTS pgfifo.resume_group(text, text);
DROP FUNCTION IF EXISTS pgfifo.pause_group(text, text);
DROP FUNCTION IF EXISTS pgfifo.skip_head(text, text, text);
DROP FUNCTION IF EXISTS pgfifo.cancel_job(bigint, text);
DROP FUNCTION IF EXISTS pgfifo.lock_group(text, text);
DROP FUNCTION IF EXISTS pgfifo.retry_jobs(bigint[]);
DROP FUNCTION IF EXISTS pgfifo.require_read_committed(text);

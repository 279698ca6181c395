-- Reverts 0001_init. The migration runner's bookkeeping table stays.
DROP FUNCTION IF EXISTS pgfifo.complete(bigint[], integer[], text[], text[], jsonb[], bigint[], text[], text[]);
DROP FUNCTION IF EXISTS pgfifo.start_attempts(bigint[], integer[], text);
DROP FUNCTION IF EXISTS pgfifo.pick(text[], integer, integer, text[], integer[], integer, integer, bigint[]);
DROP FUNCTION IF EXISTS pgfifo.advance_head(text, text, bigint);
DROP FUNCTION IF EXISTS pgfifo.promote(text[], integer);
DROP FUNCTION IF EXISTS pgfifo.enqueue(text[], text[], text[], jsonb[], smallint[], integer[], text[], bigint[], bigint[]);
DROP FUNCTION IF EXISTS pgfifo.micros_until(timestamptz, timestamptz);
DROP FUNCTION IF EXISTS pgfifo.run_after(bigint, bigint);
DROP FUNCTION IF EXISTS pgfifo.group_lock_key(text, text);
DROP FUNCTION IF EXISTS pgfifo.group_hash(text, text);
DROP TABLE IF EXISTS pgfifo.runner;
DROP TABLE IF EXISTS pgfifo.group_pause;
DROP TABLE IF EXISTS pgfifo.queue_setting;
DROP TABLE IF EXISTS pgfifo.job_attempt;
DROP TABLE IF EXISTS pgfifo.group_wake;
DROP TABLE IF EXISTS pgfifo.queue_group;
DROP TABLE IF EXISTS pgfifo.job;

-- Reverts 0011_queue_limits: queue limits, slots and buckets are dropped
-- with the functions that read them. The functions of the hot path stay:
-- they touch queue limits only while pgfifo.queue_control exists.
DROP FUNCTION IF EXISTS pgfifo.change_queue_control(text, text[], integer, integer, bigint, integer);
DROP FUNCTION IF EXISTS pgfifo.queue_limits_of(text);
DROP FUNCTION IF EXISTS pgfifo.queue_slot_key(text, integer);
-- (Long runs release the queue slot a claim kept with this one: 0.2.0's
-- runners unlock their runs themselves.)
DROP FUNCTION IF EXISTS pgfifo.unlock_long_run(integer);
DROP FUNCTION IF EXISTS pgfifo.queue_bucket_tokens(text, timestamptz, integer, bigint, integer);
DROP FUNCTION IF EXISTS pgfifo.queue_bucket_due(text, timestamptz, integer, bigint, integer);
DROP FUNCTION IF EXISTS pgfifo.queue_token_due(text, timestamptz);
DROP FUNCTION IF EXISTS pgfifo.take_queue_tokens(bigint[], timestamptz);
DROP FUNCTION IF EXISTS pgfifo.give_back_queue_tokens(bigint[], timestamptz);
DROP TABLE IF EXISTS pgfifo.queue_bucket;
DROP TABLE IF EXISTS pgfifo.queue_slot;
DROP TABLE IF EXISTS pgfifo.queue_control;
-- The function set recorded as installed is no longer what is installed:
-- the next `migrate up` installs it again.
DELETE FROM pgfifo.schema_functions;

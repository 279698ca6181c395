-- Reverts 0006_group_controls: limits, buckets and snooze marks are dropped
-- (snoozed groups keep waiting until their time, as delayed heads), with
-- the functions that read them. The functions of the hot path stay: they
-- touch group controls only while pgfifo.group_control exists.
DROP FUNCTION IF EXISTS pgfifo.set_group_control(text, text, integer, bigint, integer, integer, integer, boolean);
DROP FUNCTION IF EXISTS pgfifo.change_group_control(text, text, text[], integer, bigint, integer, integer, integer);
DROP FUNCTION IF EXISTS pgfifo.apply_group_control(text, text);
DROP FUNCTION IF EXISTS pgfifo.check_group_control(text, integer, bigint);
DROP FUNCTION IF EXISTS pgfifo.ensure_slots(text, text, integer);
DROP FUNCTION IF EXISTS pgfifo.clean_group_controls(integer);
DROP FUNCTION IF EXISTS pgfifo.take_start_tokens(bigint[], timestamptz);
DROP FUNCTION IF EXISTS pgfifo.forget_attempts(bigint[], integer[]);
DROP FUNCTION IF EXISTS pgfifo.next_token_in(text, text);
DROP FUNCTION IF EXISTS pgfifo.token_due(text, text, timestamptz);
DROP FUNCTION IF EXISTS pgfifo.group_tokens(text, text, timestamptz);
DROP FUNCTION IF EXISTS pgfifo.bucket_due(text, text, timestamptz, integer, bigint, integer);
DROP FUNCTION IF EXISTS pgfifo.bucket_tokens(text, text, timestamptz, integer, bigint, integer);
DROP FUNCTION IF EXISTS pgfifo.group_limits(text, text);
DROP TABLE IF EXISTS pgfifo.group_snooze;
DROP TABLE IF EXISTS pgfifo.group_slot;
DROP TABLE IF EXISTS pgfifo.group_bucket;
DROP TABLE IF EXISTS pgfifo.group_control;
-- The function set recorded as installed is no longer what is installed:
-- the next `migrate up` installs it again.
DELETE FROM pgfifo.schema_functions;

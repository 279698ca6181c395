-- Reverts 0013_dependencies: the dependencies' tables go, with the
-- functions that read them (18_dependencies.sql, 19_dependencies_api.sql).
-- The functions of the hot path stay: they call into dependencies only
-- while pgfifo.job_dependency exists. Jobs still waiting stay queued with their far-future run_after:
-- an operator releases or cancels them (docs/batches.md).
DROP FUNCTION IF EXISTS pgfifo.enqueue_after(text[], text[], text[], jsonb[], smallint[], integer[], bigint[], bigint[], text[], integer[], bigint[], bigint[]);
DROP FUNCTION IF EXISTS pgfifo.add_job_after(text, text, jsonb, bigint[], bigint[], text, text, timestamptz, interval, integer, integer);
DROP FUNCTION IF EXISTS pgfifo.dependency_waits(bigint[]);
DROP FUNCTION IF EXISTS pgfifo.dependency_outcomes(bigint[], text[]);
DROP FUNCTION IF EXISTS pgfifo.dependency_batch_settled(bigint);
DROP FUNCTION IF EXISTS pgfifo.dependency_settle(bigint[], boolean);
DROP FUNCTION IF EXISTS pgfifo.release_dependents(bigint, integer);
DROP FUNCTION IF EXISTS pgfifo.dependency_state(bigint, bigint);
DROP FUNCTION IF EXISTS pgfifo.dependency_wait_at();
DROP TABLE IF EXISTS pgfifo.job_wait;
DROP TABLE IF EXISTS pgfifo.job_dependency;
-- The function set recorded as installed is no longer what is installed:
-- the next `migrate up` installs it again.
DELETE FROM pgfifo.schema_functions;

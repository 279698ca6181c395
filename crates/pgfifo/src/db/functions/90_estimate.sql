-- Estimates of job counts from the planner's statistics.
--
-- Installed whole by `migrate` (CREATE OR REPLACE) after the numbered
-- migrations; see crates/pgfifo/src/migrate.rs and docs/upgrading.md for
-- how a change of arguments or result type is made.

-- The planner's estimate of how many jobs of a queue are in a state (from
-- the statistics ANALYZE keeps, with the (queue, state) statistics object):
-- how status reports the final states, which are never counted row by row.
-- NULL while the table has never been analyzed (the planner would guess).
CREATE OR REPLACE FUNCTION pgfifo.estimate_jobs(p_queue text, p_state text) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_plan json;
BEGIN
    -- (Distributed: the coordinator keeps no statistics of the shards'
    -- rows, and its planner's guess for a distributed table is no count.)
    /*@dist RETURN NULL; */
    IF (SELECT c.reltuples < 0 FROM pg_class AS c WHERE c.oid = 'pgfifo.job'::regclass) THEN
        RETURN NULL;
    END IF;
    EXECUTE 'EXPLAIN (FORMAT JSON) SELECT 1 FROM pgfifo.job WHERE queue = $1 AND state = $2'
        INTO v_plan USING p_queue, p_state;
    RETURN (v_plan -> 0 -> 'Plan' ->> 'Plan Rows')::bigint;
END
$$;

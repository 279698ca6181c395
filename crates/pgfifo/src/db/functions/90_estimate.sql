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
    /*@dist v_sum bigint; */
BEGIN
    -- (Distributed: the coordinator keeps no statistics of the shards'
    -- rows; each worker keeps its shards'. The estimate of every shard of
    -- the job table, on its worker, added up; NULL while none of them was
    -- analyzed, and when a shard could not answer.)
    /*@dist
    SELECT CASE WHEN bool_and(r.success)
                THEN sum(CASE WHEN r.result ~ '^[0-9]+$' THEN r.result::bigint END) END
    INTO v_sum
    FROM run_command_on_shards(
        'pgfifo.job',
        'SELECT pgfifo.estimate_rows(''%s'', ' || quote_literal(p_queue) || ', '
            || quote_literal(p_state) || ')') AS r;
    RETURN v_sum;
    */
    IF (SELECT c.reltuples < 0 FROM pg_class AS c WHERE c.oid = 'pgfifo.job'::regclass) THEN
        RETURN NULL;
    END IF;
    EXECUTE 'EXPLAIN (FORMAT JSON) SELECT 1 FROM pgfifo.job WHERE queue = $1 AND state = $2'
        INTO v_plan USING p_queue, p_state;
    RETURN (v_plan -> 0 -> 'Plan' ->> 'Plan Rows')::bigint;
END
$$;

-- The same estimate for the job table p_table, one of its shards on the
-- distributed layout (estimate_jobs calls it on each worker, for each of
-- its shards; only on that layout). A small shard (under 10,000 rows when
-- last analyzed) is counted instead: the planner's floor of one row per
-- shard would otherwise add up to the number of shards for a state that
-- has none.
/*@dist
CREATE OR REPLACE FUNCTION pgfifo.estimate_rows(p_table text, p_queue text, p_state text)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_plan json;
    v_rows real := (SELECT c.reltuples FROM pg_class AS c WHERE c.oid = p_table::regclass);
    v_n    bigint;
BEGIN
    IF v_rows IS NULL OR v_rows < 0 THEN
        RETURN NULL; -- never analyzed
    ELSIF v_rows < 10000 THEN
        EXECUTE format('SELECT count(*) FROM %s WHERE queue = $1 AND state = $2', p_table::regclass)
            INTO v_n USING p_queue, p_state;
        RETURN v_n;
    END IF;
    EXECUTE format('EXPLAIN (FORMAT JSON) SELECT 1 FROM %s WHERE queue = $1 AND state = $2',
                   p_table::regclass)
        INTO v_plan USING p_queue, p_state;
    RETURN (v_plan -> 0 -> 'Plan' ->> 'Plan Rows')::bigint;
END
$$;
*/

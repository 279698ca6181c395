-- Recording the start of attempts, outside the jobs' transactions.
--
-- Installed whole by `migrate` (CREATE OR REPLACE) after the numbered
-- migrations; see crates/pgfifo/src/migrate.rs and docs/upgrading.md for
-- how a change of arguments or result type is made.

-- Records the start of an attempt for each job, in autocommit, outside the
-- jobs' transactions. Returns the attempt number of each job that still has
-- attempts left; a job missing from the result has used them all (earlier
-- attempts were interrupted) and must be marked failed. The caller holds each
-- job's locks, so no one else records attempts of these jobs concurrently.
--
-- The commit does not wait for the WAL flush (synchronous_commit is off for
-- this transaction only): the record is visible at once and durable within
-- the WAL writer's delay. A crash of the runner's process loses nothing; a
-- crash of the server can lose the newest records, giving those jobs one
-- extra attempt.
CREATE OR REPLACE FUNCTION pgfifo.start_attempts(p_ids bigint[], p_max integer[], p_runner text)
RETURNS TABLE (job_id bigint, attempt integer)
LANGUAGE plpgsql
SET plan_cache_mode = /*@plain*/ force_generic_plan /*@end*/ /*@dist force_custom_plan */
AS $$
DECLARE
    v_now     timestamptz := clock_timestamp();
    v_refused bigint[] := '{}';
    v_q_refused bigint[] := '{}';
    v_q_took  boolean := false;
BEGIN
    -- (Distributed: the function below, with the jobs' parts, read from
    -- every shard: these jobs may come from several picks.)
    /*@dist
    RETURN QUERY SELECT * FROM pgfifo.start_attempts(
        p_ids, p_max, p_runner,
        ARRAY(SELECT DISTINCT j.part FROM pgfifo.job AS j WHERE j.id = ANY (p_ids)));
    RETURN;
    */
    PERFORM set_config('synchronous_commit', 'off', true);
    -- Rate-limited groups take a token per start, in this transaction: a
    -- start counts against the limit even if its runner dies mid-run. (A
    -- job that has no attempt left takes one too: it is a moment from being
    -- marked failed, and never runs.) A job whose group had no token left
    -- does not start: it is returned with attempt 0, and no record.
    -- Queues with a rate (migration 0011) take theirs first, and get back
    -- those of starts that their groups then refuse.
    IF to_regclass('pgfifo.queue_control') IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM pgfifo.queue_control AS c WHERE c.rate_count IS NOT NULL) THEN
            -- The buckets of these jobs' queues are locked first (in queue
            -- order, as take_queue_tokens locks them), and the time of the
            -- starts is read once they are held: the starts' records are
            -- then in the order their tokens were taken, each at the time
            -- its bucket was counted. (Read before a wait for a bucket
            -- held by another start, a start's record could precede the
            -- other's while its token was counted after it: a window of
            -- the records would show more starts than burst + rate × t.)
            PERFORM 1 FROM pgfifo.queue_bucket AS b
            WHERE b.queue IN (SELECT j.queue FROM pgfifo.job AS j
                              JOIN pgfifo.queue_control AS c
                                ON c.queue = j.queue AND c.rate_count IS NOT NULL
                              WHERE j.id = ANY (p_ids))
            ORDER BY b.queue
            FOR UPDATE;
            IF FOUND THEN
                v_now := clock_timestamp();
            END IF;
            v_q_refused := pgfifo.take_queue_tokens(p_ids, v_now);
            v_q_took := true;
        END IF;
    END IF;
    IF to_regclass('pgfifo.group_control') IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM pgfifo.group_control) THEN
            v_refused := pgfifo.take_start_tokens(
                ARRAY(SELECT i FROM unnest(p_ids) AS i WHERE i <> ALL (v_q_refused)), v_now);
            IF v_q_took AND cardinality(v_refused) > 0 THEN
                PERFORM pgfifo.give_back_queue_tokens(v_refused, v_now);
            END IF;
        END IF;
    END IF;
    v_refused := v_refused || v_q_refused;
    RETURN QUERY
    INSERT INTO pgfifo.job_attempt AS a (job_id, attempt, runner, started_at)
    SELECT t.id, coalesce(m.n, 0) + 1, p_runner, v_now
    FROM unnest(p_ids, p_max) AS t(id, max_attempts)
    CROSS JOIN LATERAL (SELECT max(x.attempt) AS n FROM pgfifo.job_attempt x WHERE x.job_id = t.id) AS m
    WHERE coalesce(m.n, 0) < t.max_attempts AND t.id <> ALL (v_refused)
    RETURNING a.job_id, a.attempt;
    IF cardinality(v_refused) > 0 THEN
        RETURN QUERY SELECT r.id, 0 FROM unnest(v_refused) AS r(id);
    END IF;
END
$$;

-- Distributed: the same for jobs of one shard, whose parts the pick left in
-- pgfifo.pick_parts (the runner passes them on), so that every statement
-- on a distributed table is routed to that shard: the rate-limited queues'
-- tokens as above (their buckets are tables of the coordinator), the
-- groups' (their buckets are on the groups' shard), then the records.
/*@dist
CREATE OR REPLACE FUNCTION pgfifo.start_attempts(p_ids bigint[], p_max integer[], p_runner text,
                                                 p_parts integer[])
RETURNS TABLE (job_id bigint, attempt integer)
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_refused bigint[] := '{}';
    v_q_refused bigint[] := '{}';
    v_q_took boolean := false;
    v_queues text[];
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    -- (As above: the queues' buckets locked first, in queue order, and
    -- the starts' time read once they are held.)
    IF EXISTS (SELECT 1 FROM pgfifo.queue_control AS c WHERE c.rate_count IS NOT NULL) THEN
        -- (The jobs' queues read first: the buckets are plain tables of the
        -- coordinator, which Citus does not lock in one statement with a
        -- distributed table.)
        v_queues := ARRAY(SELECT DISTINCT j.queue FROM pgfifo.job AS j
                          WHERE j.part = ANY (p_parts) AND j.id = ANY (p_ids));
        PERFORM 1 FROM pgfifo.queue_bucket AS b
        WHERE b.queue = ANY (v_queues)
          AND EXISTS (SELECT 1 FROM pgfifo.queue_control AS c
                      WHERE c.queue = b.queue AND c.rate_count IS NOT NULL)
        ORDER BY b.queue
        FOR UPDATE;
        IF FOUND THEN
            v_now := clock_timestamp();
        END IF;
        v_q_refused := pgfifo.take_queue_tokens(p_ids, v_now, p_parts);
        v_q_took := true;
    END IF;
    IF EXISTS (SELECT 1 FROM pgfifo.group_control) THEN
        v_refused := pgfifo.take_start_tokens(
            ARRAY(SELECT i FROM unnest(p_ids) AS i WHERE i <> ALL (v_q_refused)), v_now, p_parts);
        IF v_q_took AND cardinality(v_refused) > 0 THEN
            PERFORM pgfifo.give_back_queue_tokens(v_refused, v_now);
        END IF;
    END IF;
    v_refused := v_refused || v_q_refused;
    -- (A join, not a correlated subquery, and materialized: Citus prunes
    -- the read to the one shard only so; the insert then routes its rows.)
    RETURN QUERY
    WITH last AS MATERIALIZED (
        SELECT j.id, j.part, max(x.attempt) AS n
        FROM pgfifo.job AS j
        LEFT JOIN pgfifo.job_attempt AS x ON x.part = j.part AND x.job_id = j.id
        WHERE j.part = ANY (p_parts) AND j.id = ANY (p_ids)
        GROUP BY j.id, j.part)
    INSERT INTO pgfifo.job_attempt AS a (job_id, attempt, runner, started_at, part)
    SELECT t.id, coalesce(l.n, 0) + 1, p_runner, v_now, l.part
    FROM unnest(p_ids, p_max) AS t(id, max_attempts)
    JOIN last AS l ON l.id = t.id
    WHERE coalesce(l.n, 0) < t.max_attempts AND t.id <> ALL (v_refused)
    RETURNING a.job_id, a.attempt;
    IF cardinality(v_refused) > 0 THEN
        RETURN QUERY SELECT r.id, 0 FROM unnest(v_refused) AS r(id);
    END IF;
END
$$;
*/

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
    PERFORM set_config('synchronous_commit', 'off', true);
    -- Rate-limited groups take a token per start, in this transaction: a
    -- start counts against the limit even if its runner dies mid-run. (A
    -- job that has no attempt left takes one too: it is a moment from being
    -- marked failed, and never runs.) A job whose group had no token left
    -- does not start: it is returned with attempt 0, and no record.
    -- Queues with a rate (migration 0011) take theirs first, and get back
    -- those of starts that their groups then refuse.
    IF to_regclass('pgfifo.queue_control') IS NOT NULL /*@dist AND false */ THEN
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
                ARRAY(SELECT i FROM unnest(p_ids) AS i WHERE i <> ALL (v_q_refused)), v_now
                /*@dist , ARRAY(SELECT DISTINCT j.part FROM pgfifo.job AS j WHERE j.id = ANY (p_ids)) */);
            IF v_q_took AND cardinality(v_refused) > 0 THEN
                PERFORM pgfifo.give_back_queue_tokens(v_refused, v_now);
            END IF;
        END IF;
    END IF;
    v_refused := v_refused || v_q_refused;
    /*@plain*/
    RETURN QUERY
    INSERT INTO pgfifo.job_attempt AS a (job_id, attempt, runner, started_at)
    SELECT t.id, coalesce(m.n, 0) + 1, p_runner, v_now
    FROM unnest(p_ids, p_max) AS t(id, max_attempts)
    CROSS JOIN LATERAL (SELECT max(x.attempt) AS n FROM pgfifo.job_attempt x WHERE x.job_id = t.id) AS m
    WHERE coalesce(m.n, 0) < t.max_attempts AND t.id <> ALL (v_refused)
    RETURNING a.job_id, a.attempt;
    /*@end*/
    -- Distributed: the jobs' parts and last attempts first, in one read of
    -- every shard (these jobs come from several runners' picks), then the
    -- records, each routed to its job's shard.
    /*@dist
    RETURN QUERY
    WITH last AS (
        SELECT j.id, j.part,
               (SELECT max(x.attempt) FROM pgfifo.job_attempt AS x
                WHERE x.part = j.part AND x.job_id = j.id) AS n
        FROM pgfifo.job AS j WHERE j.id = ANY (p_ids))
    INSERT INTO pgfifo.job_attempt AS a (job_id, attempt, runner, started_at, part)
    SELECT t.id, coalesce(l.n, 0) + 1, p_runner, v_now, l.part
    FROM unnest(p_ids, p_max) AS t(id, max_attempts)
    JOIN last AS l ON l.id = t.id
    WHERE coalesce(l.n, 0) < t.max_attempts AND t.id <> ALL (v_refused)
    RETURNING a.job_id, a.attempt;
    */
    IF cardinality(v_refused) > 0 THEN
        RETURN QUERY SELECT r.id, 0 FROM unnest(v_refused) AS r(id);
    END IF;
END
$$;

-- Distributed: the same for jobs of one shard, whose parts the pick left in
-- pgfifo.pick_parts (the runner passes them on), so that every statement
-- is routed to that shard: the rate-limited groups' tokens as above (their
-- buckets are on the groups' shard; queue limits refuse on this layout),
-- then the records.
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
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    IF EXISTS (SELECT 1 FROM pgfifo.group_control) THEN
        v_refused := pgfifo.take_start_tokens(p_ids, v_now, p_parts);
    END IF;
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

-- Deleting old finished jobs and long-idle groups.
--
-- Installed whole by `migrate` (CREATE OR REPLACE) after the numbered
-- migrations; see crates/pgfifo/src/migrate.rs and docs/upgrading.md for
-- how a change of arguments or result type is made.

-- Deletes finished jobs (in p_states) that finished before p_before, with
-- their attempt records, walking the table in id order from p_after_id and
-- looking at p_limit rows at most: short transactions, resumable. A job that
-- is still some group's head (a held failed head) is kept. Returns how many
-- were deleted, the last id looked at, whether the walk is over (the end of
-- the table, or jobs created after p_before, which cannot qualify), and the
-- first id looked at that a later walk may still have to delete (unfinished,
-- or finished too recently, or kept as a head): a caller that walks again
-- can start there instead of at the beginning.
/*@plain*/
CREATE OR REPLACE FUNCTION pgfifo.purge_jobs(p_before timestamptz, p_states text[], p_after_id bigint, p_limit integer)
RETURNS TABLE (deleted bigint, last_id bigint, done boolean, first_pending bigint)
LANGUAGE sql
BEGIN ATOMIC
    WITH scanned AS (
        SELECT j.id, j.queue, j.group_id, j.state, j.finished_at, j.created_at
        FROM pgfifo.job AS j
        WHERE j.id > p_after_id
        ORDER BY j.id
        LIMIT p_limit),
    doomed AS (
        DELETE FROM pgfifo.job AS j
        USING scanned AS s
        WHERE j.id = s.id AND s.state = ANY (p_states) AND s.finished_at < p_before
          AND j.state = ANY (p_states)
          AND NOT EXISTS (SELECT 1 FROM pgfifo.queue_group AS g
                          WHERE g.queue = s.queue AND g.group_id = s.group_id AND g.head_id = s.id)
        RETURNING j.id),
    attempts AS (
        DELETE FROM pgfifo.job_attempt AS a USING doomed AS d WHERE a.job_id = d.id)
    SELECT (SELECT count(*) FROM doomed),
           coalesce((SELECT max(s.id) FROM scanned AS s), p_after_id),
           (SELECT count(*) < p_limit OR bool_or(s.created_at >= p_before) FROM scanned AS s),
           (SELECT min(s.id) FROM scanned AS s
            WHERE s.state = 'queued'
               OR (s.state = ANY (p_states) AND s.id NOT IN (SELECT d.id FROM doomed AS d)));
END;

/*@end*/
-- Distributed: the same walk over every shard (the scanned rows' states
-- and parts read first, then the deletes routed to the parts they name).
/*@dist
CREATE OR REPLACE FUNCTION pgfifo.purge_jobs(p_before timestamptz, p_states text[], p_after_id bigint, p_limit integer)
RETURNS TABLE (deleted bigint, last_id bigint, done boolean, first_pending bigint)
LANGUAGE plpgsql
SET citus.multi_shard_modify_mode = 'sequential'
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    v_ids     bigint[];
    v_parts   integer[];
    v_queued  bigint;
    v_doomed  bigint[];
    v_dparts  integer[];
    v_heads   bigint[];
    v_gone    bigint[];
BEGIN
    SELECT coalesce(max(s.id), p_after_id),
           count(*) < p_limit OR coalesce(bool_or(s.created_at >= p_before), false),
           coalesce(array_agg(s.id) FILTER (WHERE s.state = ANY (p_states)
                                              AND s.finished_at < p_before), '{}'),
           coalesce(array_agg(s.part) FILTER (WHERE s.state = ANY (p_states)
                                                AND s.finished_at < p_before), '{}'),
           min(s.id) FILTER (WHERE s.state = 'queued'),
           coalesce(array_agg(s.id) FILTER (WHERE s.state = ANY (p_states)), '{}')
    INTO last_id, done, v_doomed, v_dparts, v_queued, v_ids
    FROM (SELECT j.id, j.part, j.state, j.finished_at, j.created_at
          FROM pgfifo.job AS j
          WHERE j.id > p_after_id
          ORDER BY j.id
          LIMIT p_limit) AS s;
    v_heads := ARRAY(SELECT g.head_id FROM pgfifo.queue_group AS g
                     WHERE g.part = ANY (v_dparts) AND g.head_id = ANY (v_doomed));
    WITH gone AS (
        DELETE FROM pgfifo.job AS j
        WHERE j.part = ANY (v_dparts) AND j.id = ANY (v_doomed) AND j.id <> ALL (v_heads)
          AND j.state = ANY (p_states)
        RETURNING j.id)
    SELECT coalesce(array_agg(gone.id), '{}') INTO v_gone FROM gone;
    DELETE FROM pgfifo.job_attempt AS a
    WHERE a.part = ANY (v_dparts) AND a.job_id = ANY (v_gone);
    deleted := cardinality(v_gone);
    first_pending := (SELECT min(x) FROM unnest(v_ids || v_queued) AS x
                      WHERE x IS NOT NULL AND x <> ALL (v_gone));
    RETURN NEXT;
END
$$;
*/
-- Deletes queue_group rows idle since before p_before (at most p_limit), for
-- queues with many short-lived groups. A deleted group is recreated by the
-- next enqueue into it, exactly as a new one. Paused groups are kept (the
-- pause row would outlive them anyway, but listing them stays simple).
/*@plain*/
CREATE OR REPLACE FUNCTION pgfifo.clean_groups(p_before timestamptz, p_limit integer) RETURNS bigint
LANGUAGE sql
BEGIN ATOMIC
    WITH victims AS (
        SELECT g.queue, g.group_id FROM pgfifo.queue_group AS g
        WHERE g.head_id IS NULL AND g.ready_at IS NULL
          AND coalesce(g.idle_since, g.created_at) < p_before
          AND NOT EXISTS (SELECT 1 FROM pgfifo.group_pause AS p
                          WHERE p.queue = g.queue AND p.group_id = g.group_id)
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED),
    gone AS (
        DELETE FROM pgfifo.queue_group AS g USING victims AS v
        WHERE g.queue = v.queue AND g.group_id = v.group_id
        RETURNING 1)
    SELECT count(*) FROM gone;
END;

/*@end*/
-- Distributed: the candidates read from every shard without locks, then
-- each deleted by a statement that names its part (Citus routes a locking
-- read only when its part is one constant), with the same conditions
-- checked again under the lock.
/*@dist
CREATE OR REPLACE FUNCTION pgfifo.clean_groups(p_before timestamptz, p_limit integer) RETURNS bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    v_cand  record;
    v_part  integer;
    v_n     bigint := 0;
    v_rows  bigint;
BEGIN
    FOR v_cand IN
        SELECT g.part, g.queue, g.group_id FROM pgfifo.queue_group AS g
        WHERE g.head_id IS NULL AND g.ready_at IS NULL
          AND coalesce(g.idle_since, g.created_at) < p_before
          AND NOT EXISTS (SELECT 1 FROM pgfifo.group_pause AS p
                          WHERE p.part = g.part AND p.queue = g.queue
                            AND p.group_id = g.group_id)
        LIMIT p_limit
    LOOP
        v_part := v_cand.part;
        DELETE FROM pgfifo.queue_group AS g
        WHERE g.part = v_part AND (g.queue, g.group_id) IN (
            SELECT x.queue, x.group_id FROM pgfifo.queue_group AS x
            WHERE x.part = v_part AND x.queue = v_cand.queue AND x.group_id = v_cand.group_id
              AND x.head_id IS NULL AND x.ready_at IS NULL
              AND coalesce(x.idle_since, x.created_at) < p_before
              AND NOT EXISTS (SELECT 1 FROM pgfifo.group_pause AS p
                              WHERE p.part = v_part AND p.queue = x.queue
                                AND p.group_id = x.group_id)
            FOR UPDATE SKIP LOCKED);
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        v_n := v_n + v_rows;
    END LOOP;
    RETURN v_n;
END
$$;
*/
-- Deletes the trace contexts (pgfifo.job_trace, docs/tracing.md) of jobs
-- with ids in (p_after_id, p_last_id] that no longer exist: called with the
-- range that a batch of purge_jobs walked, in the same statement, after it.
-- Returns how many. Does nothing without the table (reverted migration 9).
CREATE OR REPLACE FUNCTION pgfifo.purge_job_traces(p_after_id bigint, p_last_id bigint)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_n bigint := 0;
BEGIN
    IF to_regclass('pgfifo.job_trace') IS NOT NULL THEN
        DELETE FROM pgfifo.job_trace AS t
        WHERE t.job_id > p_after_id AND t.job_id <= p_last_id
          AND NOT EXISTS (SELECT 1 FROM pgfifo.job AS j
                          WHERE /*@dist j.part = t.part AND */ j.id = t.job_id);
        GET DIAGNOSTICS v_n = ROW_COUNT;
    END IF;
    RETURN v_n;
END
$$;

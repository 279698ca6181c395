-- Putting failed jobs back, in order.
--
-- Installed whole by `migrate` (CREATE OR REPLACE) after the numbered
-- migrations; see crates/pgfifo/src/migrate.rs and docs/upgrading.md for
-- how a change of arguments or result type is made.

-- Puts failed jobs back in their queues: each becomes queued again with a
-- fresh budget of max_attempts, and runs next in its group (ids keep the
-- original order: a retried job comes before every job enqueued after it).
-- Returns one row per input id: 'retried', 'not_failed' (queued or finished
-- otherwise; left alone), 'unique_key_taken' (another queued job holds its
-- unique key) or 'missing'.
--
-- The group's head is moved to the retried job at once when the group row is
-- free. When it is locked, a job of the group is running: its completion
-- advances the head to the oldest queued job (usually the retried one; a
-- completion whose snapshot predates the retry takes the next); a wake row
-- makes promote check again once the row is free. A held group is released
-- only if its failed head is among the retried jobs: other retried jobs of it
-- wait behind the held head, in order.
CREATE OR REPLACE FUNCTION pgfifo.retry_jobs(p_ids bigint[])
RETURNS TABLE (id bigint, result text)
LANGUAGE plpgsql
AS $$
DECLARE
    v_job     record;
    v_retried bigint[] := '{}';
    v_group   record;
    v_head    record;
    v_next    record;
    /*@dist v_part integer; */
    /*@dist v_max integer; */
    /*@dist v_present bigint[]; */
    /*@dist v_failed bigint[]; */
BEGIN
    PERFORM pgfifo.require_read_committed('retry');
    FOR v_job IN
        SELECT j.id, j.queue, j.unique_key /*@dist , j.part */ FROM pgfifo.job AS j
        WHERE j.id = ANY (p_ids) AND j.state = 'failed'
        ORDER BY j.id
        /*@plain*/ FOR UPDATE /*@end*/
    LOOP
        -- (Distributed: the read above found the parts, on every shard;
        -- each job is locked on its own.)
        /*@dist
        PERFORM 1 FROM pgfifo.job AS j
        WHERE j.part = v_job.part AND j.id = v_job.id AND j.state = 'failed'
        FOR UPDATE;
        CONTINUE WHEN NOT FOUND;
        v_max := (SELECT max(a.attempt) FROM pgfifo.job_attempt AS a
                  WHERE a.part = v_job.part AND a.job_id = v_job.id);
        */
        IF v_job.unique_key IS NOT NULL AND EXISTS (
            SELECT 1 FROM pgfifo.job AS q
            WHERE q.queue = v_job.queue AND q.unique_key = v_job.unique_key AND q.state = 'queued'
              /*@dist AND q.part = v_job.part */
        ) THEN
            id := v_job.id;
            result := 'unique_key_taken';
            RETURN NEXT;
            CONTINUE;
        END IF;
        BEGIN
            UPDATE pgfifo.job AS j
            SET state = 'queued', run_after = now(), finished_at = NULL,
                attempt_base = greatest(j.attempts,
                    coalesce(/*@plain*/ (SELECT max(a.attempt) FROM pgfifo.job_attempt AS a
                                         WHERE a.job_id = j.id) /*@end*/
                             /*@dist v_max */, 0))
            WHERE j.id = v_job.id /*@dist AND j.part = v_job.part */;
        EXCEPTION WHEN unique_violation THEN
            -- An enqueue of the same key committed meanwhile.
            id := v_job.id;
            result := 'unique_key_taken';
            RETURN NEXT;
            CONTINUE;
        END;
        v_retried := v_retried || v_job.id;
        id := v_job.id;
        result := 'retried';
        RETURN NEXT;
    END LOOP;

    /*@plain*/
    RETURN QUERY
    SELECT t.id, CASE WHEN EXISTS (SELECT 1 FROM pgfifo.job AS j WHERE j.id = t.id)
                      THEN 'not_failed' ELSE 'missing' END
    FROM unnest(p_ids) AS t(id)
    WHERE NOT EXISTS (SELECT 1 FROM pgfifo.job AS j
                      WHERE j.id = t.id AND (j.id = ANY (v_retried) OR j.state = 'failed'));
    /*@end*/
    -- (Distributed: the same from two reads, without a correlated subquery.)
    /*@dist
    v_present := ARRAY(SELECT j.id FROM pgfifo.job AS j WHERE j.id = ANY (p_ids));
    v_failed := ARRAY(SELECT j.id FROM pgfifo.job AS j WHERE j.id = ANY (p_ids) AND j.state = 'failed');
    RETURN QUERY
    SELECT t.id, CASE WHEN t.id = ANY (v_present) THEN 'not_failed' ELSE 'missing' END
    FROM unnest(p_ids) AS t(id)
    WHERE NOT (t.id = ANY (v_retried) OR t.id = ANY (v_failed));
    */

    -- Retried jobs no longer count as failed in their batches.
    IF cardinality(v_retried) > 0 AND to_regclass('pgfifo.batch_job') IS NOT NULL /*@dist AND false */ THEN
        PERFORM pgfifo.batch_retried(v_retried);
    END IF;

    FOR v_group IN
        SELECT DISTINCT j.queue, j.group_id FROM pgfifo.job AS j
        WHERE j.id = ANY (v_retried) AND j.group_id IS NOT NULL
        ORDER BY 1, 2
    LOOP
        /*@dist v_part := pgfifo.part_of(v_group.queue, v_group.group_id); */
        SELECT g.head_id, g.ready_at INTO v_head FROM pgfifo.queue_group AS g
        WHERE g.queue = v_group.queue AND g.group_id = v_group.group_id
          /*@dist AND g.part = v_part */
        FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            -- Locked (a job runs) or missing (never promoted): promote sees to it.
            INSERT INTO pgfifo.group_wake (queue, group_id /*@dist , part */)
            VALUES (v_group.queue, v_group.group_id /*@dist , v_part */);
            PERFORM pg_notify('pgfifo_groups', v_group.queue);
            CONTINUE;
        END IF;
        IF v_head.head_id IS NULL AND EXISTS (SELECT 1 FROM pgfifo.group_pause AS p
                WHERE p.queue = v_group.queue AND p.group_id = v_group.group_id
                  /*@dist AND p.part = v_part */) THEN
            CONTINUE; -- paused and parked: resuming wakes it
        END IF;
        SELECT j.id, j.priority, j.run_after INTO v_next FROM pgfifo.job AS j
        WHERE j.queue = v_group.queue AND j.group_id = v_group.group_id AND j.state = 'queued'
          /*@dist AND j.part = v_part */
        ORDER BY j.id LIMIT 1;
        IF v_head.head_id IS NOT NULL AND v_head.ready_at IS NULL
           AND NOT v_head.head_id = ANY (v_retried) THEN
            CONTINUE; -- held at a job not retried: the retried ones wait behind it
        END IF;
        -- Idle, held at a retried job, or behind the retried job.
        IF v_head.head_id IS NULL OR v_head.ready_at IS NULL OR v_next.id < v_head.head_id THEN
            UPDATE pgfifo.queue_group
            SET head_id = v_next.id, priority = v_next.priority, ready_at = v_next.run_after,
                idle_since = NULL
            WHERE queue = v_group.queue AND group_id = v_group.group_id /*@dist AND part = v_part */;
        END IF;
    END LOOP;

    PERFORM pg_notify('pgfifo', q)
    FROM (SELECT DISTINCT j.queue FROM pgfifo.job AS j WHERE j.id = ANY (v_retried)) AS s(q);
END
$$;

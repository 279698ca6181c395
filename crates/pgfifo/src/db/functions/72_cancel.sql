-- Cancelling a job that has not finished.
--
-- Installed whole by `migrate` (CREATE OR REPLACE) after the numbered
-- migrations; see crates/pgfifo/src/migrate.rs and docs/upgrading.md for
-- how a change of arguments or result type is made.

-- Cancels a queued job (waiting, scheduled or between retries). Returns
-- 'cancelled', 'running' (its transaction holds it: nothing changed),
-- 'not_queued' (finished already) or 'missing'. A cancelled head is replaced by
-- the next job of its group.
CREATE OR REPLACE FUNCTION pgfifo.cancel_job(p_id bigint, p_reason text) RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_job   record;
    v_head  bigint;
    v_held  boolean := false;
    /*@dist v_now timestamptz := now(); */
BEGIN
    PERFORM pgfifo.require_read_committed('cancel');
    -- (Distributed: this read finds the job's part, on every shard.)
    SELECT j.queue, j.group_id, j.state /*@dist , j.part */ INTO v_job
    FROM pgfifo.job AS j WHERE j.id = p_id;
    IF NOT FOUND THEN
        RETURN 'missing';
    END IF;
    IF v_job.state <> 'queued' THEN
        RETURN 'not_queued';
    END IF;
    IF v_job.group_id IS NOT NULL THEN
        -- Same lock order as pick: the group first, then the job.
        v_held := pgfifo.lock_group(v_job.queue, v_job.group_id);
        IF v_held THEN
            SELECT g.head_id INTO v_head FROM pgfifo.queue_group AS g
            WHERE g.queue = v_job.queue AND g.group_id = v_job.group_id
              /*@dist AND g.part = v_job.part */;
        ELSE
            -- Locked (a job of the group runs) or never promoted. A job other
            -- than the head can go without the group's lock.
            SELECT g.head_id INTO v_head FROM pgfifo.queue_group AS g
            WHERE g.queue = v_job.queue AND g.group_id = v_job.group_id
              /*@dist AND g.part = v_job.part */;
            IF FOUND AND v_head = p_id THEN
                RETURN 'running';
            END IF;
        END IF;
    END IF;
    PERFORM 1 FROM pgfifo.job AS j WHERE j.id = p_id AND j.state = 'queued' /*@dist AND j.part = v_job.part */ FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN CASE WHEN EXISTS (SELECT 1 FROM pgfifo.job AS j WHERE j.id = p_id AND j.state = 'queued' /*@dist AND j.part = v_job.part */)
                    THEN 'running' ELSE 'not_queued' END;
    END IF;
    UPDATE pgfifo.job
    SET state = 'cancelled', finished_at = /*@plain*/ now() /*@end*/ /*@dist v_now */,
        last_error = coalesce(p_reason, last_error)
    WHERE id = p_id /*@dist AND part = v_job.part */;
    IF to_regclass('pgfifo.batch_job') IS NOT NULL /*@dist AND false */ THEN
        PERFORM pgfifo.batch_outcomes(ARRAY[p_id], ARRAY['cancelled']);
    END IF;
    -- Its dependents, and its own wait (see 18_dependencies.sql).
    IF to_regclass('pgfifo.job_dependency') IS NOT NULL /*@dist AND false */ THEN
        IF EXISTS (SELECT 1 FROM pgfifo.job_wait) THEN
            PERFORM pgfifo.dependency_outcomes(ARRAY[p_id], ARRAY['cancelled']);
        END IF;
    END IF;
    IF v_held AND v_head = p_id THEN
        PERFORM pgfifo.advance_head(v_job.queue, v_job.group_id, p_id);
        PERFORM pg_notify('pgfifo', v_job.queue);
    END IF;
    RETURN 'cancelled';
END
$$;

-- Skipping a group's head.
--
-- Installed whole by `migrate` (CREATE OR REPLACE) after the numbered
-- migrations; see crates/pgfifo/src/migrate.rs and docs/upgrading.md for
-- how a change of arguments or result type is made.

-- Marks the head of a group failed (if it is not already: a held head is
-- failed) and lets the group go on. Returns the head's id; NULL when the
-- group has no head (idle, or paused: its jobs wait until it is resumed).
-- Raises when the group is locked: its head is running.
CREATE OR REPLACE FUNCTION pgfifo.skip_head(p_queue text, p_group text, p_reason text) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_head    bigint;
    v_ready   timestamptz;
    v_skipped integer;
    v_queued  boolean;
    /*@dist v_part integer := pgfifo.part_of(p_queue, p_group); */
    /*@dist v_now timestamptz := now(); */
BEGIN
    PERFORM pgfifo.require_read_committed('skip-head');
    IF pgfifo.lock_group(p_queue, p_group) THEN
        SELECT g.head_id, g.ready_at INTO v_head, v_ready FROM pgfifo.queue_group AS g
        WHERE g.queue = p_queue AND g.group_id = p_group /*@dist AND g.part = v_part */;
    ELSE
        IF EXISTS (SELECT 1 FROM pgfifo.queue_group AS g WHERE g.queue = p_queue AND g.group_id = p_group /*@dist AND g.part = v_part */) THEN
            RAISE EXCEPTION 'the head of group % in queue % is running', p_group, p_queue
                USING ERRCODE = 'lock_not_available', CONSTRAINT = 'pgfifo_group_busy',
                      HINT = 'wait for it to finish, or let its timeout end it';
        END IF;
        RETURN NULL;
    END IF;
    IF v_head IS NULL THEN
        RETURN NULL;
    END IF;
    -- A head held after failing for good counts as failed in its batch
    -- already. Its state is read with its row locked: an operator's retry
    -- may be queueing it again (committing after this statement began), and
    -- the update below then marks the queued job failed; read without the
    -- lock, its failure would not be counted in its batch.
    SELECT j.state = 'queued' INTO v_queued FROM pgfifo.job AS j
    WHERE j.id = v_head /*@dist AND j.part = v_part */
    FOR UPDATE;
    UPDATE pgfifo.job
    SET state = 'failed',
        finished_at = CASE WHEN state = 'queued' THEN /*@plain*/ now() /*@end*/ /*@dist v_now */
                           ELSE finished_at END,
        last_error = coalesce(p_reason, last_error)
    WHERE id = v_head AND (state = 'queued' OR (state = 'failed' AND v_ready IS NULL))
      /*@dist AND part = v_part */;
    GET DIAGNOSTICS v_skipped = ROW_COUNT;
    IF v_skipped > 0 AND v_queued AND to_regclass('pgfifo.batch_job') IS NOT NULL /*@dist AND false */ THEN
        PERFORM pgfifo.batch_outcomes(ARRAY[v_head], ARRAY['failed']);
    END IF;
    -- Its dependents, and its own wait (see 18_dependencies.sql).
    IF v_skipped > 0 AND v_queued AND to_regclass('pgfifo.job_dependency') IS NOT NULL /*@dist AND false */ THEN
        IF EXISTS (SELECT 1 FROM pgfifo.job_wait) THEN
            PERFORM pgfifo.dependency_outcomes(ARRAY[v_head], ARRAY['failed']);
        END IF;
    END IF;
    PERFORM pgfifo.advance_head(p_queue, p_group, v_head);
    PERFORM pg_notify('pgfifo', p_queue);
    -- A head left pointing at a job that finished (see advance_head) was
    -- only repaired, not skipped.
    RETURN CASE WHEN v_skipped > 0 THEN v_head END;
END
$$;

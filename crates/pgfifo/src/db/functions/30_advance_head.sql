-- Advancing a group's head, or declaring the group idle.
--
-- Installed whole by `migrate` (CREATE OR REPLACE) after the numbered
-- migrations; see crates/pgfifo/src/migrate.rs and docs/upgrading.md for
-- how a change of arguments or result type is made.

-- Makes the oldest queued job of a group (other than p_done, which the caller
-- is finishing) its head, or marks the group idle.
--
-- The caller holds the group's queue_group row FOR UPDATE. Before declaring
-- the group idle it must know that no enqueuer of the group is still inside
-- its transaction (its job would be invisible here, and the enqueuer, seeing
-- the group active, would not wake it). Enqueuers hold the group's advisory
-- lock shared until they end; this tries it exclusively, without waiting:
--   * granted: no enqueuer is in flight; look again with a fresh snapshot. A
--     job committed by then is seen; an enqueuer that comes later waits for
--     this transaction (a moment: complete is its last statement) and then
--     finds the group idle and wakes it;
--   * not granted: leave the finished job as the group's head, with ready_at
--     a little ahead. The group stays active, so enqueuers need do nothing;
--     the next pick of it finds a finished head and calls this again.
-- Never waiting here is what keeps enqueues from waiting for running jobs
-- and jobs from deadlocking with each other's enqueues. Once granted, the
-- lock lasts until the caller's transaction ends, so the caller must end it
-- before running a job: complete calls this last, and a pick that called
-- it (the setting pgfifo.holds_group_lock says so) runs nothing and asks to
-- be called again.
--
-- In the common case (the next head is ready now, same priority) only head_id
-- changes, which makes the update a HOT update (see queue_group).
--
-- Returns in how many microseconds the group's head is ready (0: now, and
-- the runner picks again rather than wait for a wake-up; NULL: the group is
-- idle). Nobody is woken for a head that becomes ready later: the runner
-- looks again by then.
CREATE OR REPLACE FUNCTION pgfifo.advance_head(p_queue text, p_group text, p_done bigint) RETURNS bigint
LANGUAGE plpgsql
-- Index-driven whatever the statistics, never JIT-compiled (see pick).
SET enable_sort = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
SET plan_cache_mode = /*@plain*/ force_generic_plan /*@end*/ /*@dist force_custom_plan */
AS $$
DECLARE
    v_next record;
    v_now  timestamptz := clock_timestamp();
    /*@dist v_part integer := pgfifo.part_of(p_queue, p_group); */
BEGIN
    SELECT id, priority, run_after INTO v_next FROM pgfifo.job
    WHERE queue = p_queue AND group_id = p_group AND state = 'queued' AND id <> p_done /*@dist AND part = v_part */
    ORDER BY id LIMIT 1;
    IF NOT FOUND THEN
        IF NOT pg_try_advisory_xact_lock(1885824614, pgfifo.group_lock_key(p_queue, p_group)) THEN
            UPDATE pgfifo.queue_group
            SET head_id = p_done, ready_at = v_now + interval '50 milliseconds'
            WHERE queue = p_queue AND group_id = p_group /*@dist AND part = v_part */;
            RETURN 50000;
        END IF;
        -- The lock lasts until the caller's transaction ends, and enqueuers
        -- of the group wait for it: the caller must not run a job in this
        -- transaction now (see pick).
        PERFORM set_config('pgfifo.holds_group_lock', 'on', true);
        SELECT id, priority, run_after INTO v_next FROM pgfifo.job
        WHERE queue = p_queue AND group_id = p_group AND state = 'queued' AND id <> p_done /*@dist AND part = v_part */
        ORDER BY id LIMIT 1;
    END IF;
    IF v_next.id IS NULL THEN
        UPDATE pgfifo.queue_group SET head_id = NULL, ready_at = NULL, idle_since = v_now
        WHERE queue = p_queue AND group_id = p_group /*@dist AND part = v_part */;
        RETURN NULL;
    END IF;
    UPDATE pgfifo.queue_group
    SET head_id  = v_next.id,
        priority = v_next.priority,
        ready_at = CASE WHEN v_next.run_after <= v_now AND ready_at <= v_now
                        THEN ready_at ELSE v_next.run_after END
    WHERE queue = p_queue AND group_id = p_group /*@dist AND part = v_part */;
    RETURN pgfifo.micros_until(v_next.run_after, v_now);
END
$$;

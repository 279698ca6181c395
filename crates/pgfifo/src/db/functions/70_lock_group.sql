-- Locking a group's row for an operator's change.
--
-- Installed whole by `migrate` (CREATE OR REPLACE) after the numbered
-- migrations; see crates/pgfifo/src/migrate.rs and docs/upgrading.md for
-- how a change of arguments or result type is made.

-- Locks a group's row for an operator's change, waiting a moment at most.
-- A running job holds its group's row for its whole run; a runner's pick can
-- also hold one for a few milliseconds without running its head (a group that
-- changed under the pick, a finished job's group until its batch commits, a
-- job taken ahead of a free slot). Returns false when the row is missing or
-- still locked after the moment (a job runs): the caller must not wait for it.
CREATE OR REPLACE FUNCTION pgfifo.lock_group(p_queue text, p_group text) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    v_timeout text := current_setting('lock_timeout');
    v_found   boolean;
    /*@dist v_part integer := pgfifo.part_of(p_queue, p_group); */
BEGIN
    PERFORM 1 FROM pgfifo.queue_group AS g
    WHERE g.queue = p_queue AND g.group_id = p_group /*@dist AND g.part = v_part */
    FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        -- A long run holds its group without the row's lock: its mark
        -- (45_long_run.sql) says a job runs.
        RETURN NOT EXISTS (SELECT 1 FROM pgfifo.queue_group AS g
                           WHERE g.queue = p_queue AND g.group_id = p_group /*@dist AND g.part = v_part */
                             AND g.ready_at = '-infinity');
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pgfifo.queue_group AS g
                   WHERE g.queue = p_queue AND g.group_id = p_group /*@dist AND g.part = v_part */) THEN
        RETURN false;
    END IF;
    PERFORM set_config('lock_timeout', '250ms', true);
    BEGIN
        PERFORM 1 FROM pgfifo.queue_group AS g
        WHERE g.queue = p_queue AND g.group_id = p_group /*@dist AND g.part = v_part */
        FOR UPDATE;
        v_found := FOUND -- (deleted while waiting: false)
                   AND NOT EXISTS (SELECT 1 FROM pgfifo.queue_group AS g
                                   WHERE g.queue = p_queue AND g.group_id = p_group /*@dist AND g.part = v_part */
                                     AND g.ready_at = '-infinity');
        PERFORM set_config('lock_timeout', v_timeout, true);
        RETURN v_found;
    EXCEPTION WHEN lock_not_available THEN
        PERFORM set_config('lock_timeout', v_timeout, true);
        RETURN false;
    END;
END
$$;

-- Pausing and resuming groups and queues.
--
-- Installed whole by `migrate` (CREATE OR REPLACE) after the numbered
-- migrations; see crates/pgfifo/src/migrate.rs and docs/upgrading.md for
-- how a change of arguments or result type is made.

-- Pauses a group: no job of it starts until it is resumed. A job running now
-- finishes; the next pick of the group parks it. Returns false if it was
-- paused already.
CREATE OR REPLACE FUNCTION pgfifo.pause_group(p_queue text, p_group text) RETURNS boolean
LANGUAGE sql
BEGIN ATOMIC
    INSERT INTO pgfifo.group_pause (queue, group_id /*@dist , part */)
    VALUES (p_queue, p_group /*@dist , pgfifo.part_of(p_queue, p_group) */)
    ON CONFLICT DO NOTHING
    RETURNING true;
END;

-- Resumes a paused group: wakes it, so a runner makes its oldest queued job
-- the head. Returns false if it was not paused.
CREATE OR REPLACE FUNCTION pgfifo.resume_group(p_queue text, p_group text) RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    DELETE FROM pgfifo.group_pause WHERE queue = p_queue AND group_id = p_group
      /*@dist AND part = pgfifo.part_of(p_queue, p_group) */;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO pgfifo.group_wake (queue, group_id /*@dist , part */)
    VALUES (p_queue, p_group /*@dist , pgfifo.part_of(p_queue, p_group) */);
    PERFORM pg_notify('pgfifo_groups', p_queue);
    RETURN true;
END
$$;

-- Pauses or resumes a whole queue (jobs keep being accepted). Returns the
-- previous setting.
CREATE OR REPLACE FUNCTION pgfifo.set_queue_paused(p_queue text, p_paused boolean) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    v_was boolean;
    -- (Citus takes only constants in an upsert's update of a reference table.)
    /*@dist v_now timestamptz := now(); */
BEGIN
    SELECT s.paused INTO v_was FROM pgfifo.queue_setting AS s WHERE s.queue = p_queue FOR UPDATE;
    INSERT INTO pgfifo.queue_setting AS s (queue, paused) VALUES (p_queue, p_paused)
    ON CONFLICT (queue) DO UPDATE SET paused = p_paused, updated_at = /*@plain*/ now() /*@end*/ /*@dist v_now */;
    IF NOT p_paused THEN
        PERFORM pg_notify('pgfifo', p_queue);
    END IF;
    RETURN coalesce(v_was, false);
END
$$;

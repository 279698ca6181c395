-- A queue's failure policy.
--
-- Installed whole by `migrate` (CREATE OR REPLACE) after the numbered
-- migrations; see crates/pgfifo/src/migrate.rs and docs/upgrading.md for
-- how a change of arguments or result type is made.

-- Sets a queue's failure policy. Switching to 'continue' releases the groups
-- that are held: each is woken, and promote (which releases held groups of a
-- 'continue' queue) lets it go on past its failed head; nothing here waits
-- for a group row. Returns the number of groups released.
CREATE OR REPLACE FUNCTION pgfifo.set_failure_policy(p_queue text, p_policy text) RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    v_released integer := 0;
    -- (Citus takes only constants in an upsert's update of a reference table.)
    /*@dist v_now timestamptz := now(); */
BEGIN
    INSERT INTO pgfifo.queue_setting AS s (queue, failure_policy) VALUES (p_queue, p_policy)
    ON CONFLICT (queue) DO UPDATE SET failure_policy = p_policy, updated_at = /*@plain*/ now() /*@end*/ /*@dist v_now */;
    IF p_policy = 'continue' THEN
        INSERT INTO pgfifo.group_wake (queue, group_id /*@dist , part */)
        SELECT g.queue, g.group_id /*@dist , g.part */ FROM pgfifo.queue_group AS g
        WHERE g.queue = p_queue AND g.ready_at IS NULL AND g.head_id IS NOT NULL;
        GET DIAGNOSTICS v_released = ROW_COUNT;
        PERFORM pg_notify('pgfifo_groups', p_queue);
    END IF;
    RETURN v_released;
END
$$;

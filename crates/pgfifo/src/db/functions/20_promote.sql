-- Promote: groups that enqueuers woke become active.
--
-- Installed whole by `migrate` (CREATE OR REPLACE) after the numbered
-- migrations; see crates/pgfifo/src/migrate.rs and docs/upgrading.md for
-- how a change of arguments or result type is made.

-- Makes groups woken by enqueuers active: creates missing group rows and sets
-- the head of idle ones. Runs in its own short transaction on a runner's
-- connection (never in a job's transaction, whose locks last for the job).
--
-- A wake row becomes visible with the commit of its enqueuer, so the jobs are
-- visible too. Each group row is locked SKIP LOCKED before it is looked at; a
-- row someone holds (a runner, another promote) is not waited for: its wake
-- row is put back for the next promote. The head is then read in a separate
-- statement, whose snapshot follows the lock. Groups are handled in sorted
-- order. The commit does not wait for the WAL flush: if the server crashes,
-- the wake rows come back with the promotion.
--
-- A paused group stays idle (resuming wakes it again). A held group (its
-- failed head, ready_at NULL, in a queue whose policy is 'hold') is left
-- alone; one whose queue went back to 'continue', or whose head an operator
-- retried, is released. An active group whose head has not started yet gets
-- an older queued job as its head if one became visible (an enqueuer that
-- committed late, an operator's retry); a head that started keeps its place.
--
-- promoted: the wake rows it handled; rows of groups it found locked (a job
-- runs) are put back and not counted, so a caller that promotes until
-- nothing is left does not spin on them. ready_later_us: in how many
-- microseconds each head it set that is not ready yet (a delayed job)
-- becomes ready (NULL: none), when the runner looks again; nobody is woken
-- for them.
CREATE OR REPLACE FUNCTION pgfifo.promote(
    p_queues           text[],
    p_limit            integer,
    OUT promoted       integer,
    OUT ready_later_us bigint[]
)
LANGUAGE plpgsql
-- Short queries on small tables: compiling them would cost 100x running them.
SET jit = off
SET plan_cache_mode = /*@plain*/ force_generic_plan /*@end*/ /*@dist force_custom_plan */
-- (Distributed: its reads of every shard on one connection per worker, as
-- the pick's: see there.)
/*@dist SET citus.max_adaptive_executor_pool_size = 1 */
AS $$
DECLARE
    v_wake  record;
    v_taken integer := 0;
    v_group record;
    v_next  record;
    v_locked boolean;
    v_now   timestamptz := clock_timestamp();
    v_head_at timestamptz;
    v_due   timestamptz;
    v_controlled boolean;
    v_head_us bigint;
    /*@dist v_part integer; */
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    -- (Distributed: shard by shard, in one order, so that two promotes
    -- deleting the same wake rows wait for each other and never deadlock.)
    /*@dist PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true); */
    -- (Distributed: a read of every shard, in parallel, first says whether
    -- there is a wake row at all; the delete below walks the shards one by
    -- one, which an idle runner's lanes, promoting as a fallback for lost
    -- notifications, would otherwise pay on every poll.)
    /*@dist
    IF NOT EXISTS (SELECT 1 FROM pgfifo.group_wake AS x WHERE x.queue = ANY (p_queues)) THEN
        promoted := 0;
        RETURN;
    END IF;
    */
    FOR v_wake IN
        WITH taken AS (
            /*@plain*/
            DELETE FROM pgfifo.group_wake
            WHERE ctid = ANY (ARRAY(SELECT ctid FROM pgfifo.group_wake
                                    WHERE queue = ANY (p_queues)
                                    LIMIT p_limit FOR UPDATE SKIP LOCKED))
            /*@end*/
            -- Distributed: the wake rows of up to p_limit groups, read
            -- from every shard, then deleted by key (a second promote
            -- waits for the first's deletes, then finds them gone).
            /*@dist
            DELETE FROM pgfifo.group_wake AS w
            USING (SELECT DISTINCT x.part, x.queue, x.group_id FROM pgfifo.group_wake AS x
                   WHERE x.queue = ANY (p_queues) LIMIT p_limit) AS t
            WHERE w.part = t.part AND w.queue = t.queue AND w.group_id = t.group_id
            RETURNING w.queue, w.group_id)
            */
            /*@plain*/
            RETURNING queue, group_id)
            /*@end*/
        SELECT queue, group_id, count(*) AS n FROM taken GROUP BY 1, 2 ORDER BY 1, 2
    LOOP
        /*@dist v_part := pgfifo.part_of(v_wake.queue, v_wake.group_id); */
        -- The group row, locked, and whether the group is paused. Not found:
        -- missing (created here), or locked by someone else.
        FOR v_try IN 1 .. 2 LOOP
            -- (Distributed: the pause is read apart, once the row is
            -- locked; Citus routes a locking read with a subquery only
            -- when its part is a constant, not a variable's value.)
            SELECT g.head_id, g.ready_at,
                   /*@plain*/
                   EXISTS (SELECT 1 FROM pgfifo.group_pause AS p
                           WHERE p.queue = g.queue AND p.group_id = g.group_id)
                   /*@end*/
                   /*@dist false */ AS paused
            INTO v_group FROM pgfifo.queue_group AS g
            WHERE g.queue = v_wake.queue AND g.group_id = v_wake.group_id
              /*@dist AND g.part = v_part */
            FOR NO KEY UPDATE OF g SKIP LOCKED;
            v_locked := FOUND;
            /*@dist
            IF v_locked THEN
                v_group.paused := EXISTS (SELECT 1 FROM pgfifo.group_pause AS p
                                          WHERE p.part = v_part AND p.queue = v_wake.queue
                                            AND p.group_id = v_wake.group_id);
            END IF;
            */
            -- (A row someone holds is not inserted again: the insert would
            -- wait for a transaction that updated it.)
            EXIT WHEN v_locked OR v_try = 2
                   OR EXISTS (SELECT 1 FROM pgfifo.queue_group AS g
                              WHERE g.queue = v_wake.queue AND g.group_id = v_wake.group_id
                                /*@dist AND g.part = v_part */);
            INSERT INTO pgfifo.queue_group (queue, group_id, slot /*@dist , part */)
            VALUES (v_wake.queue, v_wake.group_id, pgfifo.group_hash(v_wake.queue, v_wake.group_id)
                    /*@dist , pgfifo.part_of(v_wake.queue, v_wake.group_id) */)
            ON CONFLICT (/*@dist part, */ queue, group_id) DO NOTHING;
        END LOOP;
        IF NOT v_locked THEN
            INSERT INTO pgfifo.group_wake (queue, group_id /*@dist , part */)
            VALUES (v_wake.queue, v_wake.group_id /*@dist , pgfifo.part_of(v_wake.queue, v_wake.group_id) */);
            CONTINUE;
        END IF;
        v_taken := v_taken + v_wake.n;
        v_controlled := to_regclass('pgfifo.group_control') IS NOT NULL;
        IF v_controlled THEN
            v_controlled := EXISTS (SELECT 1 FROM pgfifo.group_control AS c
                                    WHERE c.queue = v_wake.queue);
        END IF;
        IF v_group.head_id IS NOT NULL AND v_group.ready_at IS NULL THEN
            -- Held: stays so while its head is failed and its queue holds.
            CONTINUE WHEN EXISTS (SELECT 1 FROM pgfifo.job AS j
                                  WHERE j.id = v_group.head_id AND j.state = 'failed' /*@dist AND j.part = v_part */)
                      AND EXISTS (SELECT 1 FROM pgfifo.queue_setting AS s
                                  WHERE s.queue = v_wake.queue AND s.failure_policy = 'hold');
        END IF;
        CONTINUE WHEN v_group.paused;
        -- A head that waited for its dependencies (ready_at at
        -- pgfifo.dependency_wait_at(), spelt out: that function goes with
        -- `migrate down` below 13) and was cancelled meanwhile, by its
        -- policy (see 18_dependencies.sql), which does not lock the
        -- group: ready now, so that the next pick finds a finished head
        -- and moves it on (advance_head, under the group's locks). (Only
        -- that time: a head waiting for a rate limit's token keeps it.)
        IF v_group.ready_at >= '9999-12-31 00:00:00+00'::timestamptz
           AND v_group.head_id IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM pgfifo.job AS j
                           WHERE j.id = v_group.head_id AND j.state = 'queued' /*@dist AND j.part = v_part */) THEN
            UPDATE pgfifo.queue_group SET ready_at = v_now
            WHERE queue = v_wake.queue AND group_id = v_wake.group_id
              /*@dist AND part = v_part */;
            CONTINUE;
        END IF;
        SELECT j.id, j.priority, j.run_after INTO v_next FROM pgfifo.job AS j
        WHERE j.queue = v_wake.queue AND j.group_id = v_wake.group_id AND j.state = 'queued'
          /*@dist AND j.part = v_part */
        ORDER BY j.id LIMIT 1;
        IF NOT FOUND THEN
            IF v_group.head_id IS NOT NULL AND v_group.ready_at IS NULL THEN
                -- A released held group with nothing visible behind its
                -- head: idle, through advance_head, which declares it so
                -- only while no enqueuer is in flight. An enqueuer that saw
                -- the group active before its head failed and held it left
                -- no wake row; its job, not committed yet, is invisible
                -- here. advance_head then leaves the finished head in place,
                -- ready in 50 ms, and the pick that finds it looks again.
                v_head_us := pgfifo.advance_head(v_wake.queue, v_wake.group_id, v_group.head_id);
                IF v_head_us > 0 THEN
                    ready_later_us := ready_later_us || v_head_us;
                END IF;
            END IF;
            CONTINUE;
        END IF;
        IF v_group.ready_at > v_now THEN
            -- A head waiting for its time (scheduled, retrying, snoozed) or
            -- for its group's next token: the time again, by the group's
            -- limits now (they may have just changed: set_group_control
            -- wakes waiting groups).
            SELECT j.run_after INTO v_head_at FROM pgfifo.job AS j
            WHERE j.id = v_group.head_id AND j.state = 'queued' /*@dist AND j.part = v_part */;
            IF FOUND THEN
                v_due := v_head_at;
                IF v_controlled THEN
                    v_due := greatest(v_due, pgfifo.token_due(v_wake.queue, v_wake.group_id, v_now));
                END IF;
                IF v_due <> v_group.ready_at THEN
                    UPDATE pgfifo.queue_group SET ready_at = v_due
                    WHERE queue = v_wake.queue AND group_id = v_wake.group_id
              /*@dist AND part = v_part */;
                    v_group.ready_at := v_due;
                    IF v_due > v_now THEN
                        ready_later_us := ready_later_us || pgfifo.micros_until(v_due, v_now);
                    END IF;
                END IF;
            END IF;
        END IF;
        IF v_group.ready_at IS NOT NULL THEN
            -- Active: only an older job, and only before the head started.
            CONTINUE WHEN v_next.id >= v_group.head_id;
            CONTINUE WHEN EXISTS (SELECT 1 FROM pgfifo.job_attempt AS a
                                  WHERE a.job_id = v_group.head_id /*@dist AND a.part = v_part */);
        END IF;
        -- (A rate-limited group with an empty bucket becomes ready with its
        -- next token.)
        v_due := v_next.run_after;
        IF v_controlled THEN
            v_due := greatest(v_due, pgfifo.token_due(v_wake.queue, v_wake.group_id, v_now));
        END IF;
        UPDATE pgfifo.queue_group
        SET head_id = v_next.id, priority = v_next.priority, ready_at = v_due,
            idle_since = NULL
        WHERE queue = v_wake.queue AND group_id = v_wake.group_id
              /*@dist AND part = v_part */;
        -- In a queue with weights, a group back from idle gets no credit
        -- for the time it had no work (see pgfifo.rejoin_share).
        IF v_controlled AND v_group.ready_at IS NULL
           AND to_regclass('pgfifo.group_share') IS NOT NULL THEN
            -- (In branches: after `migrate down`, the shares' functions
            -- are gone.)
            IF pgfifo.queue_weighted(v_wake.queue) THEN
                PERFORM pgfifo.rejoin_share(v_wake.queue, v_wake.group_id);
            END IF;
        END IF;
        IF v_due > v_now THEN
            ready_later_us := ready_later_us
                              || pgfifo.micros_until(v_due, clock_timestamp());
        END IF;
        -- A group that may run several jobs at once has a slot row for each.
        IF v_controlled THEN
            PERFORM pgfifo.ensure_slots(v_wake.queue, v_wake.group_id, l.concurrency)
            FROM pgfifo.group_limits(v_wake.queue, v_wake.group_id) AS l
            WHERE l.concurrency > 1;
        END IF;
    END LOOP;
    promoted := v_taken;
END
$$;

-- Writing the outcomes of a pick's jobs.
--
-- Installed whole by `migrate` (CREATE OR REPLACE) after the numbered
-- migrations; see crates/pgfifo/src/migrate.rs and docs/upgrading.md for
-- how a change of arguments or result type is made.

-- Writes the outcomes of the attempts of a pick's jobs, in their transaction,
-- just before it commits: element i of each array is job i's. p_outcomes[i]
-- is 'succeeded', 'retry', 'failed', 'cancelled' or 'snoozed'. A retry keeps
-- the job at the head of its group until p_retry_delay_us[i] passes. A
-- snooze does the same without using an attempt: the attempt's record is
-- deleted, and pgfifo.group_snooze says until when and by which job the
-- group sleeps.
-- Any other outcome advances the head. A rate-limited group whose bucket is
-- empty waits for its next token (see 15_controls.sql). p_queues and p_groups are the jobs' (the caller has them
-- from pick).
--
-- Several jobs of one group (a head and its followers, see pick) are the
-- group's next jobs in id order, each of which ran only after the ones
-- before it succeeded: only the last of them (the highest id) may have
-- another outcome. That last job decides the group: a retry, a snooze or a
-- failure that holds makes it the head; any other outcome moves the head
-- to the oldest queued job not completed in this call (a follower handed
-- back unstarted is one). A call that breaks this order is refused.
--
-- A grouped job that failed for good in a queue whose failure policy is
-- 'hold' stays its group's head and holds it (see queue_group).
--
-- Reports the work these jobs left that nobody is woken for: a group's next
-- head (enqueues into an active group wake nobody), a retry, a group
-- advance_head could not yet declare idle. ready_now: some is ready now (the
-- runner picks again for it); ready_later_us: in how many microseconds each
-- of the rest is ready (NULL: none), when the runner looks again.
CREATE OR REPLACE FUNCTION pgfifo.complete(
    p_ids              bigint[],
    p_attempts         integer[],
    p_outcomes         text[],
    p_errors           text[],
    p_results          jsonb[],
    p_retry_delay_us   bigint[],
    p_queues           text[],
    p_groups           text[],
    OUT ready_now      boolean,
    OUT ready_later_us bigint[]
)
LANGUAGE plpgsql
SET enable_sort = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
SET plan_cache_mode = /*@plain*/ force_generic_plan /*@end*/ /*@dist force_custom_plan */
AS $$
DECLARE
    v_now      timestamptz := clock_timestamp();
    v_n        integer := coalesce(cardinality(p_ids), 0);
    v_advanced integer;
    v_moved    bigint[];
    v_ready_in bigint;
    v_id       bigint;
    v_queue    text;
    v_group    text;
    v_outcome  text;
    v_due      timestamptz;
    v_controlled boolean := false;
    v_inactive text[] := '{}';
    v_locked   text[] := '{}';
    v_skipped  text[] := '{}';
    v_key      text;
    v_row_ready timestamptz;
    v_lim      record;
    v_superseded bigint[] := '{}';
    v_dup      boolean := false;
    v_batches  text;
    v_job_batches bigint[];
    -- The parts of the shard whose jobs this transaction picked.
    /*@dist v_parts integer[] := nullif(current_setting('pgfifo.pick_parts', true), '')::integer[]; */
    /*@dist v_part integer; */
    /*@dist v_rows integer; */
    -- Retry times, computed here: Citus refuses a time computed in an
    -- update's CASE (timestamptz arithmetic is not immutable).
    /*@dist v_retry_at timestamptz[] := ARRAY(SELECT v_now + d.us * interval '1 microsecond'
                                             FROM unnest(p_retry_delay_us) WITH ORDINALITY AS d(us, n)
                                             ORDER BY d.n); */
BEGIN
    -- (Array expressions, not queries: plpgsql evaluates them without
    -- starting an executor.)
    IF NOT coalesce(p_outcomes <@ ARRAY['succeeded', 'retry', 'failed', 'cancelled', 'snoozed'], false) THEN
        RAISE EXCEPTION 'pgfifo complete: unknown outcome in %', p_outcomes
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The jobs' transaction must still be the one that picked them: a
    -- handler that sent COMMIT itself has released their locks.
    IF current_setting('pgfifo.job_transaction', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION 'pgfifo complete: not in the job''s transaction (did the handler COMMIT?)'
            USING ERRCODE = 'no_active_sql_transaction', CONSTRAINT = 'pgfifo_job_transaction';
    END IF;
    -- (Distributed: the jobs are on the shard of this transaction's pick;
    -- without it, or when a job is not there, nothing may be written.)
    /*@dist
    IF v_parts IS NULL THEN
        RAISE EXCEPTION 'pgfifo complete: no pick in this transaction (pgfifo.pick_parts is unset)'
            USING ERRCODE = 'no_active_sql_transaction', CONSTRAINT = 'pgfifo_job_transaction';
    END IF;
    */
    ready_now := false;
    IF to_regclass('pgfifo.group_control') IS NOT NULL THEN
        v_controlled := EXISTS (SELECT 1 FROM pgfifo.group_control AS c WHERE c.queue = ANY (p_queues));
    END IF;
    IF v_controlled THEN
        -- A group whose concurrency is above 1 is not held by its jobs'
        -- transactions (see pick): lock the rows of this call's groups now
        -- (a no-op for the groups this transaction holds already), and
        -- leave alone the groups that another job held or parked meanwhile
        -- (ready_at NULL).
        SELECT coalesce(array_agg(l.k) FILTER (WHERE l.ready_at IS NULL), '{}'),
               coalesce(array_agg(l.k), '{}')
        INTO v_inactive, v_locked
        FROM (SELECT g.queue || chr(31) || g.group_id AS k, g.ready_at
              FROM pgfifo.queue_group AS g
              JOIN (SELECT DISTINCT t.q, t.grp FROM unnest(p_queues, p_groups) AS t(q, grp)) AS d
                ON g.queue = d.q AND g.group_id = d.grp
              /*@dist WHERE g.part = ANY (v_parts) */
              ORDER BY g.queue, g.group_id
              FOR UPDATE OF g SKIP LOCKED) AS l;
        -- A row another transaction holds: another completion of the group
        -- (a moment), or a job that started when the group's concurrency
        -- was 1 and holds it for its run. A job that finished (or failed,
        -- unless that holds the group) and is not the group's head changes
        -- nothing of the group: leave the row alone rather than wait. (If
        -- the other completion makes this job the head meanwhile, the
        -- group's next completion, or its next pick, moves the head on.)
        -- Any other must wait for the row. (One slot job per pick: a call
        -- waits for one group's row at most.)
        FOR v_i IN 1 .. v_n LOOP
            CONTINUE WHEN p_groups[v_i] IS NULL;
            v_key := p_queues[v_i] || chr(31) || p_groups[v_i];
            CONTINUE WHEN v_key = ANY (v_locked) OR v_key = ANY (v_skipped);
            IF (p_outcomes[v_i] IN ('succeeded', 'cancelled')
                OR (p_outcomes[v_i] = 'failed'
                    AND NOT EXISTS (SELECT 1 FROM pgfifo.queue_setting AS s
                                    WHERE s.queue = p_queues[v_i] AND s.failure_policy = 'hold')))
               AND NOT EXISTS (SELECT 1 FROM pgfifo.queue_group AS g
                               WHERE g.queue = p_queues[v_i] AND g.group_id = p_groups[v_i]
                                 AND g.head_id = p_ids[v_i] /*@dist AND g.part = ANY (v_parts) */) THEN
                v_skipped := v_skipped || v_key;
                -- Its group may have a job to start in the freed slot.
                ready_now := true;
            ELSE
                SELECT g.ready_at INTO v_row_ready FROM pgfifo.queue_group AS g
                WHERE g.queue = p_queues[v_i] AND g.group_id = p_groups[v_i]
                  /*@dist AND g.part = ANY (v_parts) */
                FOR UPDATE OF g;
                IF FOUND THEN
                    v_locked := v_locked || v_key;
                    IF v_row_ready IS NULL THEN
                        v_inactive := v_inactive || v_key;
                    END IF;
                END IF;
            END IF;
        END LOOP;
    END IF;
    -- The jobs' own rows first: the heads below are then the oldest jobs
    -- still queued, whichever jobs of the group this call completes.
    IF v_n = 1 THEN
        v_outcome := p_outcomes[1];
        UPDATE pgfifo.job SET
            state       = CASE WHEN v_outcome IN ('retry', 'snoozed') THEN 'queued' ELSE v_outcome END,
            attempts    = CASE WHEN v_outcome = 'snoozed' THEN attempts ELSE p_attempts[1] END,
            last_error  = coalesce(p_errors[1], last_error),
            -- (Distributed: through a subquery; Citus 13.2.2's server
            -- crashed on this update with the array's element itself.)
            result      = /*@plain*/ p_results[1] /*@end*/ /*@dist (SELECT p_results[1]) */,
            run_after   = CASE WHEN v_outcome IN ('retry', 'snoozed')
                               THEN /*@plain*/ v_now + p_retry_delay_us[1] * interval '1 microsecond' /*@end*/
                                    /*@dist v_retry_at[1] */
                               ELSE run_after END,
            finished_at = CASE WHEN v_outcome IN ('retry', 'snoozed') THEN NULL ELSE v_now END
        WHERE id = p_ids[1] /*@dist AND part = ANY (v_parts) */;
    ELSE
        UPDATE pgfifo.job AS j SET
            state       = CASE WHEN t.outcome IN ('retry', 'snoozed') THEN 'queued' ELSE t.outcome END,
            attempts    = CASE WHEN t.outcome = 'snoozed' THEN j.attempts ELSE t.attempt END,
            last_error  = coalesce(t.error, j.last_error),
            result      = t.result,
            run_after   = CASE WHEN t.outcome IN ('retry', 'snoozed')
                               THEN /*@plain*/ v_now + t.delay_us * interval '1 microsecond' /*@end*/
                                    /*@dist t.retry_at */
                               ELSE j.run_after END,
            finished_at = CASE WHEN t.outcome IN ('retry', 'snoozed') THEN NULL ELSE v_now END
        FROM unnest(p_ids, p_attempts, p_outcomes, p_errors, p_results, p_retry_delay_us
                    /*@dist , v_retry_at */)
             AS t(id, attempt, outcome, error, result, delay_us /*@dist , retry_at */)
        WHERE j.id = t.id /*@dist AND j.part = ANY (v_parts) */;
    END IF;
    /*@dist
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    IF v_rows <> v_n THEN
        RAISE EXCEPTION 'pgfifo complete: % of % jobs found on the pick''s shard (%)', v_rows, v_n, p_ids
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    */
    -- Jobs followed in this call by a later job of their group: the group's
    -- head moves (or stays) by its last job alone, and only a success may
    -- be followed.
    -- (Array expressions first, without an executor: most calls have jobs
    -- of different groups only.)
    FOR v_i IN 2 .. v_n LOOP
        v_dup := coalesce(p_groups[v_i] = ANY (p_groups[1:v_i - 1]), false);
        EXIT WHEN v_dup;
    END LOOP;
    IF v_dup THEN
        SELECT coalesce(array_agg(t.id), '{}') INTO v_superseded
        FROM unnest(p_ids, p_outcomes, p_queues, p_groups) AS t(id, outcome, q, grp)
        WHERE t.grp IS NOT NULL
          AND EXISTS (SELECT 1 FROM unnest(p_ids, p_queues, p_groups) AS u(id, q, grp)
                      WHERE u.q = t.q AND u.grp = t.grp AND u.id > t.id);
        IF cardinality(v_superseded) > 0 THEN
            IF EXISTS (SELECT 1 FROM unnest(p_ids, p_outcomes) AS t(id, outcome)
                       WHERE t.id = ANY (v_superseded) AND t.outcome <> 'succeeded') THEN
                RAISE EXCEPTION 'pgfifo complete: a job of a group ran after an earlier job of it that did not succeed (%)', p_ids
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
        END IF;
    END IF;
    -- Batches (migration 0012): the terminal outcomes count, and the events
    -- they decide enqueue their callbacks, with the batches' rows locked
    -- until this transaction commits. Before the heads move: advance_head
    -- takes advisory locks that a callback's enqueue would wait for (see
    -- 17_batches.sql). A job's batch commits with the job, before any
    -- runner can pick it, and never changes: the runner read each job's
    -- batch at its pick and sends them in the transaction-local setting
    -- pgfifo.complete_batches, one per job ('{}': none is in a batch, and
    -- nothing is done here). Runners before 0.3.0 do not set it: each
    -- job's batch is looked up, unless there is no batch at all (one probe
    -- of pgfifo.batch). (Two IFs: the query must not be parsed where
    -- migration 0012 was reverted.)
    v_batches := current_setting('pgfifo.complete_batches', true);
    IF coalesce(v_batches, '') = '' THEN
        IF to_regclass('pgfifo.batch_job') IS NOT NULL /*@dist AND false */ THEN
            IF EXISTS (SELECT 1 FROM pgfifo.batch) THEN
                PERFORM pgfifo.batch_outcomes(p_ids, p_outcomes);
            END IF;
        END IF;
    ELSIF v_batches <> '{}' THEN
        v_job_batches := v_batches::bigint[];
        IF coalesce(cardinality(v_job_batches), 0) <> v_n THEN
            RAISE EXCEPTION 'pgfifo complete: % batches for % jobs', v_batches, v_n
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        PERFORM pgfifo.batch_count_outcomes(v_job_batches, p_outcomes);
    END IF;
    -- Dependencies (migration 0013): the waiting dependents of the jobs
    -- that ended are released or cancelled, with their job_wait rows
    -- locked; nothing waits for a group (see 18_dependencies.sql). While
    -- nobody waits (one probe of pgfifo.job_wait), skipped. A dependent
    -- whose enqueue has not committed is invisible here: the sweep
    -- (release_dependents) decides it. (Two IFs, as above.)
    IF to_regclass('pgfifo.job_dependency') IS NOT NULL /*@dist AND false */ THEN
        IF EXISTS (SELECT 1 FROM pgfifo.job_wait) THEN
            PERFORM pgfifo.dependency_outcomes(p_ids, p_outcomes);
        END IF;
    END IF;
    -- The common case: the group has a next job, which becomes the head (a
    -- HOT update when it is ready at once). Not for retries (the job stays
    -- the head) nor for failures that hold their group. For several jobs, in
    -- one statement for all; a single job takes the cheaper statement below.
    IF v_n > 1 THEN
        WITH done AS (
            SELECT t.done_id, t.q, t.grp
            FROM unnest(p_ids, p_outcomes, p_queues, p_groups) AS t(done_id, outcome, q, grp)
            WHERE t.grp IS NOT NULL AND t.outcome NOT IN ('retry', 'snoozed')
              AND NOT t.done_id = ANY (v_superseded)
              AND NOT (v_controlled AND (t.q || chr(31) || t.grp) = ANY (v_inactive || v_skipped))
              AND NOT (t.outcome = 'failed'
                       AND EXISTS (SELECT 1 FROM pgfifo.queue_setting AS s
                                   WHERE s.queue = t.q AND s.failure_policy = 'hold'))),
        moved AS (
            UPDATE pgfifo.queue_group AS g
            SET head_id  = next.id,
                priority = next.priority,
                ready_at = CASE WHEN next.run_after <= v_now AND g.ready_at <= v_now
                                THEN g.ready_at ELSE next.run_after END
            FROM done
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_after FROM pgfifo.job AS j
                WHERE j.queue = q AND j.group_id = grp AND j.state = 'queued' AND j.id <> done_id
                  /*@dist AND j.part = ANY (v_parts) */
                ORDER BY j.id LIMIT 1) AS next
            WHERE g.queue = done.q AND g.group_id = done.grp /*@dist AND g.part = ANY (v_parts) */
            RETURNING done.done_id, pgfifo.micros_until(next.run_after, v_now) AS ready_in)
        SELECT array_agg(moved.done_id), coalesce(bool_or(moved.ready_in = 0), false),
               array_agg(moved.ready_in) FILTER (WHERE moved.ready_in > 0)
        INTO v_moved, ready_now, ready_later_us FROM moved;
    END IF;
    FOR v_i IN 1 .. v_n LOOP
        v_id := p_ids[v_i];
        v_queue := p_queues[v_i];
        v_group := p_groups[v_i];
        v_outcome := p_outcomes[v_i];
        /*@dist v_part := pgfifo.part_of(v_queue, v_group); */
        -- A retry (or a snooze) is work that nobody is woken for either.
        IF v_outcome IN ('retry', 'snoozed') THEN
            v_ready_in := greatest(coalesce(p_retry_delay_us[v_i], 0), 0);
            ready_now := ready_now OR coalesce(v_ready_in = 0, false);
            IF v_ready_in > 0 THEN
                ready_later_us := ready_later_us || v_ready_in;
            END IF;
        END IF;
        CONTINUE WHEN v_group IS NULL OR v_id = ANY (v_moved) OR v_id = ANY (v_superseded);
        CONTINUE WHEN v_controlled AND (v_queue || chr(31) || v_group) = ANY (v_skipped);
        IF v_controlled AND (v_queue || chr(31) || v_group) = ANY (v_inactive) THEN
            -- Held or parked while this job ran beside others of its group
            -- (concurrency above 1): its head is not this job's to move. A
            -- failure for good under 'hold' holds a parked group.
            IF v_outcome = 'failed'
               AND EXISTS (SELECT 1 FROM pgfifo.queue_setting AS s
                           WHERE s.queue = v_queue AND s.failure_policy = 'hold') THEN
                UPDATE pgfifo.queue_group SET head_id = v_id
                WHERE queue = v_queue AND group_id = v_group AND head_id IS NULL /*@dist AND part = v_part */;
            END IF;
            CONTINUE;
        END IF;
        -- (A later time than the group's: with concurrency above 1, another
        -- of its jobs may have set one.)
        -- The job becomes (stays) the head: it may have followed the head
        -- picked with it.
        IF v_outcome = 'retry' THEN
            UPDATE pgfifo.queue_group
            SET head_id = v_id,
                ready_at = greatest(ready_at, v_now + p_retry_delay_us[v_i] * interval '1 microsecond')
            WHERE queue = v_queue AND group_id = v_group /*@dist AND part = v_part */;
        ELSIF v_outcome = 'snoozed' THEN
            UPDATE pgfifo.queue_group
            SET head_id = v_id,
                ready_at = greatest(ready_at, v_now + p_retry_delay_us[v_i] * interval '1 microsecond')
            WHERE queue = v_queue AND group_id = v_group /*@dist AND part = v_part */;
            INSERT INTO pgfifo.group_snooze AS s (queue, group_id, until, job_id /*@dist , part */)
            VALUES (v_queue, v_group, v_now + p_retry_delay_us[v_i] * interval '1 microsecond', v_id
                    /*@dist , pgfifo.part_of(v_queue, v_group) */)
            ON CONFLICT (/*@dist part, */ queue, group_id) DO UPDATE SET until = excluded.until, job_id = excluded.job_id;
        ELSIF v_outcome = 'failed'
              AND EXISTS (SELECT 1 FROM pgfifo.queue_setting AS s
                          WHERE s.queue = v_queue AND s.failure_policy = 'hold') THEN
            UPDATE pgfifo.queue_group SET head_id = v_id, ready_at = NULL
            WHERE queue = v_queue AND group_id = v_group /*@dist AND part = v_part */;
        ELSE
            v_advanced := 0;
            IF v_n = 1 THEN
                WITH next AS (
                    SELECT j.id, j.priority, j.run_after FROM pgfifo.job AS j
                    WHERE j.queue = v_queue AND j.group_id = v_group AND j.state = 'queued'
                      AND j.id <> v_id /*@dist AND j.part = v_part */
                    ORDER BY j.id LIMIT 1),
                moved AS (
                    UPDATE pgfifo.queue_group AS g
                    SET head_id  = next.id,
                        priority = next.priority,
                        ready_at = CASE WHEN next.run_after <= v_now AND g.ready_at <= v_now
                                        THEN g.ready_at ELSE next.run_after END
                    FROM next
                    WHERE g.queue = v_queue AND g.group_id = v_group
                      /*@dist AND g.part = v_part */
                    RETURNING pgfifo.micros_until(next.run_after, v_now) AS ready_in)
                SELECT count(*), min(moved.ready_in)
                INTO v_advanced, v_ready_in FROM moved;
            END IF;
            -- No next job visible: advance_head decides whether the group is
            -- idle (it never waits; see there).
            IF v_advanced = 0 THEN
                v_ready_in := pgfifo.advance_head(v_queue, v_group, v_id);
            END IF;
            ready_now := ready_now OR coalesce(v_ready_in = 0, false);
            IF v_ready_in > 0 THEN
                ready_later_us := ready_later_us || v_ready_in;
            END IF;
        END IF;
    END LOOP;
    -- A rate-limited group that advanced (or retries) with its bucket empty
    -- waits for its next token: nothing picks it before then.
    IF v_controlled THEN
        FOR v_i IN 1 .. v_n LOOP
            CONTINUE WHEN p_groups[v_i] IS NULL OR p_outcomes[v_i] = 'snoozed'
                          OR (p_queues[v_i] || chr(31) || p_groups[v_i]) = ANY (v_skipped);
            SELECT * INTO v_lim FROM pgfifo.group_limits(p_queues[v_i], p_groups[v_i]);
            CONTINUE WHEN v_lim.rate_count IS NULL;
            v_due := pgfifo.bucket_due(p_queues[v_i], p_groups[v_i], v_now, v_lim.rate_count,
                                       v_lim.rate_period_ms, v_lim.burst);
            CONTINUE WHEN v_due <= v_now;
            UPDATE pgfifo.queue_group AS g SET ready_at = v_due
            WHERE g.queue = p_queues[v_i] AND g.group_id = p_groups[v_i]
              AND g.ready_at < v_due /*@dist AND g.part = ANY (v_parts) */;
            IF FOUND THEN
                ready_later_us := ready_later_us || pgfifo.micros_until(v_due, v_now);
            END IF;
        END LOOP;
    END IF;
    -- A snoozed attempt does not count: its record goes.
    IF 'snoozed' = ANY (p_outcomes) THEN
        DELETE FROM pgfifo.job_attempt AS a
        USING unnest(p_ids, p_attempts, p_outcomes) AS t(id, attempt, outcome)
        WHERE t.outcome = 'snoozed' AND a.job_id = t.id AND a.attempt = t.attempt
          /*@dist AND a.part = ANY (v_parts) */;
    END IF;
    IF cardinality(array_remove(p_errors, NULL)) > 0 THEN
        UPDATE pgfifo.job_attempt AS a SET error = t.error, finished_at = v_now
        FROM unnest(p_ids, p_attempts, p_errors) AS t(id, attempt, error)
        WHERE t.error IS NOT NULL AND a.job_id = t.id AND a.attempt = t.attempt
          /*@dist AND a.part = ANY (v_parts) */;
    END IF;
    RETURN;
END
$$;

-- pgfifo schema, version 2: what operators do by hand or on a schedule
-- (retry, cancel, skip a head, pause and resume, retention). Each function is
-- one transaction's worth of work, called by the library's admin API and the
-- `pgfifo` CLI. None of them waits for a running job: a group whose row is
-- locked has a job running (or being picked), and the function either works
-- around it or reports it.

-- The operations below that change a group's head look for the group's jobs
-- again after taking its locks, as advance_head does: each statement needs a
-- fresh snapshot, which READ COMMITTED gives and REPEATABLE READ does not.
CREATE FUNCTION pgfifo.require_read_committed(p_what text) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pgfifo %: needs READ COMMITTED isolation (found %)',
            p_what, current_setting('transaction_isolation');
    END IF;
END
$$;

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
CREATE FUNCTION pgfifo.retry_jobs(p_ids bigint[])
RETURNS TABLE (id bigint, result text)
LANGUAGE plpgsql
AS $$
DECLARE
    v_job     record;
    v_retried bigint[] := '{}';
    v_group   record;
    v_head    record;
    v_next    record;
BEGIN
    PERFORM pgfifo.require_read_committed('retry');
    FOR v_job IN
        SELECT j.id, j.queue, j.unique_key FROM pgfifo.job AS j
        WHERE j.id = ANY (p_ids) AND j.state = 'failed'
        ORDER BY j.id
        FOR UPDATE
    LOOP
        IF v_job.unique_key IS NOT NULL AND EXISTS (
            SELECT 1 FROM pgfifo.job AS q
            WHERE q.queue = v_job.queue AND q.unique_key = v_job.unique_key AND q.state = 'queued'
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
                    coalesce((SELECT max(a.attempt) FROM pgfifo.job_attempt AS a WHERE a.job_id = j.id), 0))
            WHERE j.id = v_job.id;
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

    RETURN QUERY
    SELECT t.id, CASE WHEN EXISTS (SELECT 1 FROM pgfifo.job AS j WHERE j.id = t.id)
                      THEN 'not_failed' ELSE 'missing' END
    FROM unnest(p_ids) AS t(id)
    WHERE NOT EXISTS (SELECT 1 FROM pgfifo.job AS j
                      WHERE j.id = t.id AND (j.id = ANY (v_retried) OR j.state = 'failed'));

    FOR v_group IN
        SELECT DISTINCT j.queue, j.group_id FROM pgfifo.job AS j
        WHERE j.id = ANY (v_retried) AND j.group_id IS NOT NULL
        ORDER BY 1, 2
    LOOP
        SELECT g.head_id, g.ready_at INTO v_head FROM pgfifo.queue_group AS g
        WHERE g.queue = v_group.queue AND g.group_id = v_group.group_id
        FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            -- Locked (a job runs) or missing (never promoted): promote sees to it.
            INSERT INTO pgfifo.group_wake (queue, group_id) VALUES (v_group.queue, v_group.group_id);
            CONTINUE;
        END IF;
        IF v_head.head_id IS NULL AND EXISTS (SELECT 1 FROM pgfifo.group_pause AS p
                WHERE p.queue = v_group.queue AND p.group_id = v_group.group_id) THEN
            CONTINUE; -- paused and parked: resuming wakes it
        END IF;
        SELECT j.id, j.priority, j.run_after INTO v_next FROM pgfifo.job AS j
        WHERE j.queue = v_group.queue AND j.group_id = v_group.group_id AND j.state = 'queued'
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
            WHERE queue = v_group.queue AND group_id = v_group.group_id;
        END IF;
    END LOOP;

    PERFORM pg_notify('pgfifo', q)
    FROM (SELECT DISTINCT j.queue FROM pgfifo.job AS j WHERE j.id = ANY (v_retried)) AS s(q);
END
$$;

-- Locks a group's row for an operator's change, waiting a moment at most.
-- A running job holds its group's row for its whole run; a runner's pick can
-- also hold one for a few milliseconds without running its head (a group that
-- changed under the pick, a finished job's group until its batch commits, a
-- job taken ahead of a free slot). Returns false when the row is missing or
-- still locked after the moment (a job runs): the caller must not wait for it.
CREATE FUNCTION pgfifo.lock_group(p_queue text, p_group text) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    v_timeout text := current_setting('lock_timeout');
    v_found   boolean;
BEGIN
    PERFORM 1 FROM pgfifo.queue_group AS g
    WHERE g.queue = p_queue AND g.group_id = p_group
    FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        RETURN true;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pgfifo.queue_group AS g
                   WHERE g.queue = p_queue AND g.group_id = p_group) THEN
        RETURN false;
    END IF;
    PERFORM set_config('lock_timeout', '250ms', true);
    BEGIN
        PERFORM 1 FROM pgfifo.queue_group AS g
        WHERE g.queue = p_queue AND g.group_id = p_group
        FOR UPDATE;
        v_found := FOUND; -- (deleted while waiting: false)
        PERFORM set_config('lock_timeout', v_timeout, true);
        RETURN v_found;
    EXCEPTION WHEN lock_not_available THEN
        PERFORM set_config('lock_timeout', v_timeout, true);
        RETURN false;
    END;
END
$$;

-- Cancels a queued job (waiting, scheduled or between retries). Returns
-- 'cancelled', 'running' (its transaction holds it: nothing changed),
-- 'not_queued' (finished already) or 'missing'. A cancelled head is replaced by
-- the next job of its group.
CREATE FUNCTION pgfifo.cancel_job(p_id bigint, p_reason text) RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_job   record;
    v_head  bigint;
    v_held  boolean := false;
BEGIN
    PERFORM pgfifo.require_read_committed('cancel');
    SELECT j.queue, j.group_id, j.state INTO v_job FROM pgfifo.job AS j WHERE j.id = p_id;
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
            WHERE g.queue = v_job.queue AND g.group_id = v_job.group_id;
        ELSE
            -- Locked (a job of the group runs) or never promoted. A job other
            -- than the head can go without the group's lock.
            SELECT g.head_id INTO v_head FROM pgfifo.queue_group AS g
            WHERE g.queue = v_job.queue AND g.group_id = v_job.group_id;
            IF FOUND AND v_head = p_id THEN
                RETURN 'running';
            END IF;
        END IF;
    END IF;
    PERFORM 1 FROM pgfifo.job AS j WHERE j.id = p_id AND j.state = 'queued' FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN CASE WHEN EXISTS (SELECT 1 FROM pgfifo.job AS j WHERE j.id = p_id AND j.state = 'queued')
                    THEN 'running' ELSE 'not_queued' END;
    END IF;
    UPDATE pgfifo.job
    SET state = 'cancelled', finished_at = now(), last_error = coalesce(p_reason, last_error)
    WHERE id = p_id;
    IF v_held AND v_head = p_id THEN
        PERFORM pgfifo.advance_head(v_job.queue, v_job.group_id, p_id);
        PERFORM pg_notify('pgfifo', v_job.queue);
    END IF;
    RETURN 'cancelled';
END
$$;

-- Marks the head of a group failed (if it is not already: a held head is
-- failed) and lets the group go on. Returns the head's id; NULL when the
-- group has no head (idle, or paused: its jobs wait until it is resumed).
-- Raises when the group is locked: its head is running.
CREATE FUNCTION pgfifo.skip_head(p_queue text, p_group text, p_reason text) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_head    bigint;
    v_ready   timestamptz;
    v_skipped integer;
BEGIN
    PERFORM pgfifo.require_read_committed('skip-head');
    IF pgfifo.lock_group(p_queue, p_group) THEN
        SELECT g.head_id, g.ready_at INTO v_head, v_ready FROM pgfifo.queue_group AS g
        WHERE g.queue = p_queue AND g.group_id = p_group;
    ELSE
        IF EXISTS (SELECT 1 FROM pgfifo.queue_group AS g WHERE g.queue = p_queue AND g.group_id = p_group) THEN
            RAISE EXCEPTION 'the head of group % in queue % is running', p_group, p_queue
                USING ERRCODE = 'lock_not_available',
                      HINT = 'wait for it to finish, or let its timeout end it';
        END IF;
        RETURN NULL;
    END IF;
    IF v_head IS NULL THEN
        RETURN NULL;
    END IF;
    UPDATE pgfifo.job
    SET state = 'failed',
        finished_at = CASE WHEN state = 'queued' THEN now() ELSE finished_at END,
        last_error = coalesce(p_reason, last_error)
    WHERE id = v_head AND (state = 'queued' OR (state = 'failed' AND v_ready IS NULL));
    GET DIAGNOSTICS v_skipped = ROW_COUNT;
    PERFORM pgfifo.advance_head(p_queue, p_group, v_head);
    PERFORM pg_notify('pgfifo', p_queue);
    -- A head left pointing at a job that finished (see advance_head) was
    -- only repaired, not skipped.
    RETURN CASE WHEN v_skipped > 0 THEN v_head END;
END
$$;

-- Pauses a group: no job of it starts until it is resumed. A job running now
-- finishes; the next pick of the group parks it. Returns false if it was
-- paused already.
CREATE FUNCTION pgfifo.pause_group(p_queue text, p_group text) RETURNS boolean
LANGUAGE sql
BEGIN ATOMIC
    INSERT INTO pgfifo.group_pause (queue, group_id) VALUES (p_queue, p_group)
    ON CONFLICT DO NOTHING
    RETURNING true;
END;

-- Resumes a paused group: wakes it, so a runner makes its oldest queued job
-- the head. Returns false if it was not paused.
CREATE FUNCTION pgfifo.resume_group(p_queue text, p_group text) RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    DELETE FROM pgfifo.group_pause WHERE queue = p_queue AND group_id = p_group;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO pgfifo.group_wake (queue, group_id) VALUES (p_queue, p_group);
    PERFORM pg_notify('pgfifo', p_queue);
    RETURN true;
END
$$;

-- Pauses or resumes a whole queue (jobs keep being accepted). Returns the
-- previous setting.
CREATE FUNCTION pgfifo.set_queue_paused(p_queue text, p_paused boolean) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    v_was boolean;
BEGIN
    SELECT s.paused INTO v_was FROM pgfifo.queue_setting AS s WHERE s.queue = p_queue FOR UPDATE;
    INSERT INTO pgfifo.queue_setting AS s (queue, paused) VALUES (p_queue, p_paused)
    ON CONFLICT (queue) DO UPDATE SET paused = p_paused, updated_at = now();
    IF NOT p_paused THEN
        PERFORM pg_notify('pgfifo', p_queue);
    END IF;
    RETURN coalesce(v_was, false);
END
$$;

-- Sets a queue's failure policy. Switching to 'continue' releases the groups
-- that are held: each is woken, and promote (which releases held groups of a
-- 'continue' queue) lets it go on past its failed head; nothing here waits
-- for a group row. Returns the number of groups released.
CREATE FUNCTION pgfifo.set_failure_policy(p_queue text, p_policy text) RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    v_released integer := 0;
BEGIN
    INSERT INTO pgfifo.queue_setting AS s (queue, failure_policy) VALUES (p_queue, p_policy)
    ON CONFLICT (queue) DO UPDATE SET failure_policy = p_policy, updated_at = now();
    IF p_policy = 'continue' THEN
        INSERT INTO pgfifo.group_wake (queue, group_id)
        SELECT g.queue, g.group_id FROM pgfifo.queue_group AS g
        WHERE g.queue = p_queue AND g.ready_at IS NULL AND g.head_id IS NOT NULL;
        GET DIAGNOSTICS v_released = ROW_COUNT;
        PERFORM pg_notify('pgfifo', p_queue);
    END IF;
    RETURN v_released;
END
$$;

-- Deletes finished jobs (in p_states) that finished before p_before, with
-- their attempt records, walking the table in id order from p_after_id and
-- looking at p_limit rows at most: short transactions, resumable. A job that
-- is still some group's head (a held failed head) is kept. Returns how many
-- were deleted, the last id looked at, whether the walk is over (the end of
-- the table, or jobs created after p_before, which cannot qualify), and the
-- first id looked at that a later walk may still have to delete (unfinished,
-- or finished too recently, or kept as a head): a caller that walks again
-- can start there instead of at the beginning.
CREATE FUNCTION pgfifo.purge_jobs(p_before timestamptz, p_states text[], p_after_id bigint, p_limit integer)
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

-- Deletes queue_group rows idle since before p_before (at most p_limit), for
-- queues with many short-lived groups. A deleted group is recreated by the
-- next enqueue into it, exactly as a new one. Paused groups are kept (the
-- pause row would outlive them anyway, but listing them stays simple).
CREATE FUNCTION pgfifo.clean_groups(p_before timestamptz, p_limit integer) RETURNS bigint
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

-- The planner's estimate of how many jobs of a queue are in a state (from
-- the statistics ANALYZE keeps, with the (queue, state) statistics object):
-- how status reports the final states, which are never counted row by row.
-- NULL while the table has never been analyzed (the planner would guess).
CREATE FUNCTION pgfifo.estimate_jobs(p_queue text, p_state text) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_plan json;
BEGIN
    IF (SELECT c.reltuples < 0 FROM pg_class AS c WHERE c.oid = 'pgfifo.job'::regclass) THEN
        RETURN NULL;
    END IF;
    EXECUTE 'EXPLAIN (FORMAT JSON) SELECT 1 FROM pgfifo.job WHERE queue = $1 AND state = $2'
        INTO v_plan USING p_queue, p_state;
    RETURN (v_plan -> 0 -> 'Plan' ->> 'Plan Rows')::bigint;
END
$$;

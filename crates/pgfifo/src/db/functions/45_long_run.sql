-- Long runs: jobs of types in long mode (`#[job(long)]`), which hold their
-- group without an open transaction. See migrations/0007_long_runs and
-- docs/locking.md ("Long mode").
--
-- Installed whole by `migrate` (CREATE OR REPLACE) after the numbered
-- migrations; see crates/pgfifo/src/migrate.rs and docs/upgrading.md for
-- how a change of arguments or result type is made.
--
-- The lock. A long run's holder keeps a session-level advisory lock
-- (class 1885824620, 0x7067666c 'pgfl'; key: a hash of the queue and the
-- group, or of the job for an ungrouped one) from the claim until after its
-- outcome commits. It takes no xid and holds no snapshot, and PostgreSQL
-- releases it when the session ends, however it ends. pgfifo's two-key
-- advisory space keeps it away from the application's single-key locks.
--
-- Distributed (Citus): these functions run on the coordinator, where the
-- runner's session is: the lock is that session's, on the coordinator,
-- and so are the pid and pg_locks that long_run_free reads. The run's row
-- is on its group's shard (part); the statements that know the group
-- name its part, the others (a run by its job and token) read every
-- shard: they are one per run.

-- The second key of a long run's advisory lock.
CREATE OR REPLACE FUNCTION pgfifo.long_run_key(p_queue text, p_group text, p_job bigint)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT hashtext(p_queue || chr(31) || coalesce(p_group, chr(30) || p_job::text))
$$;

-- Whether the group p_group of p_queue (or, for p_group NULL, the ungrouped
-- job p_job) is free of long runs: true when it has none, or when its
-- holder's session is gone, in which case the run's row is deleted in the
-- caller's transaction (a pick's) and its job is a queued head that runs
-- again. False while the holder's session lives; if its lease has passed
-- (a frozen process: alive, not renewing), its backend is ended, so that a
-- later pick finds the lock free. Never waits: a row another pick is
-- reclaiming counts as busy.
CREATE OR REPLACE FUNCTION pgfifo.long_run_free(p_queue text, p_group text, p_job bigint)
RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    v_run record;
    /*@dist v_part integer := pgfifo.part_of(p_queue, p_group); */
BEGIN
    IF p_group IS NOT NULL THEN
        SELECT r.job_id, r.token, r.lock_key, r.pid, r.lease_until /*@dist , r.part */ INTO v_run
        FROM pgfifo.job_run AS r WHERE r.queue = p_queue AND r.group_id = p_group
          /*@dist AND r.part = v_part */;
    ELSE
        SELECT r.job_id, r.token, r.lock_key, r.pid, r.lease_until /*@dist , r.part */ INTO v_run
        FROM pgfifo.job_run AS r WHERE r.job_id = p_job;
    END IF;
    IF NOT FOUND THEN
        RETURN true;
    END IF;
    -- Taken and given back at once: only whether someone holds it matters.
    -- (This session never holds one itself: a connection that runs a long
    -- job picks nothing until its lock is released.)
    IF pg_try_advisory_lock(1885824620, v_run.lock_key) THEN
        PERFORM pg_advisory_unlock(1885824620, v_run.lock_key);
        -- The holder's session is gone. Another pick may be reclaiming the
        -- same row: skip it rather than wait.
        /*@dist v_part := v_run.part; */
        PERFORM 1 FROM pgfifo.job_run AS r
        WHERE r.job_id = v_run.job_id AND r.token = v_run.token /*@dist AND r.part = v_part */
        FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN false;
        END IF;
        DELETE FROM pgfifo.job_run AS r WHERE r.job_id = v_run.job_id AND r.token = v_run.token
          /*@dist AND r.part = v_part */;
        RETURN true;
    END IF;
    IF v_run.lease_until < clock_timestamp() THEN
        -- Alive but not renewing: end its session, if it is still the
        -- backend that holds the lock (a pid can be reused).
        BEGIN
            PERFORM pg_terminate_backend(l.pid)
            FROM pg_locks AS l
            WHERE l.locktype = 'advisory' AND l.granted AND l.pid = v_run.pid
              AND l.database = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())
              AND l.classid = 1885824620::oid AND l.objid = v_run.lock_key::oid AND l.objsubid = 2;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING 'pgfifo: the long run of job % has not renewed its lease, and this role may not end its backend (pid %): grant it pg_signal_backend',
                v_run.job_id, v_run.pid;
        END;
    END IF;
    RETURN false;
END
$$;

-- Claims a picked job for a long run, in the pick's transaction, which
-- then commits at once: records the run and takes its session-level lock.
-- Returns the run's fencing token and lock key; no row when the lock is
-- held by another session (a hash collision, or a holder whose session is
-- still ending): the caller hands the job back.
CREATE OR REPLACE FUNCTION pgfifo.claim_long_run(
    p_job      bigint,
    p_queue    text,
    p_group    text,
    p_attempt  integer,
    p_runner   text,
    p_lease_ms integer
)
RETURNS TABLE (token bigint, lock_key integer)
LANGUAGE plpgsql
AS $$
DECLARE
    v_key   integer := pgfifo.long_run_key(p_queue, p_group, p_job);
    v_token bigint;
    -- (Distributed: the run's part is its job's, its group's part; the
    -- values are taken here, on the coordinator, for the routed insert.)
    /*@dist
    v_part  integer;
    v_pid   integer := pg_backend_pid();
    v_until timestamptz := clock_timestamp() + p_lease_ms * interval '1 millisecond';
    */
BEGIN
    IF current_setting('pgfifo.job_transaction', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION 'pgfifo.claim_long_run must run in the job transaction that picked the job'
            USING ERRCODE = 'no_active_sql_transaction', CONSTRAINT = 'pgfifo_job_transaction';
    END IF;
    IF NOT pg_try_advisory_lock(1885824620, v_key) THEN
        RETURN;
    END IF;
    /*@plain*/
    INSERT INTO pgfifo.job_run AS r (job_id, queue, group_id, token, lock_key, pid, runner,
                                     attempt, lease_until)
    VALUES (p_job, p_queue, p_group, nextval('pgfifo.job_run_token_seq'), v_key, pg_backend_pid(),
            p_runner, p_attempt, clock_timestamp() + p_lease_ms * interval '1 millisecond')
    ON CONFLICT DO NOTHING
    RETURNING r.token INTO v_token;
    /*@end*/
    /*@dist
    IF p_group IS NOT NULL THEN
        v_part := pgfifo.part_of(p_queue, p_group);
    ELSE
        SELECT j.part INTO v_part FROM pgfifo.job AS j WHERE j.id = p_job;
    END IF;
    v_token := nextval('pgfifo.job_run_token_seq');
    INSERT INTO pgfifo.job_run AS r (job_id, queue, group_id, token, lock_key, pid, runner,
                                     attempt, lease_until, part)
    VALUES (p_job, p_queue, p_group, v_token, v_key, v_pid, p_runner, p_attempt, v_until, v_part)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        v_token := NULL;
    END IF;
    */
    IF v_token IS NULL THEN
        PERFORM pg_advisory_unlock(1885824620, v_key);
        RETURN;
    END IF;
    -- A queue slot the pick took for this job (queue limits, migration
    -- 0011) stays held by this session too, when the runner releases it
    -- with pgfifo.unlock_long_run (it says so: pgfifo.long_queue_slot; a
    -- 0.2.0 runner does not, and its long runs hold no queue slot).
    IF current_setting('pgfifo.long_queue_slot', true) = 'on'
       AND split_part(coalesce(current_setting('pgfifo.queue_slot', true), ''), chr(31), 1) = p_queue THEN
        PERFORM pg_advisory_lock(1885824625, pgfifo.queue_slot_key(
            p_queue, split_part(current_setting('pgfifo.queue_slot', true), chr(31), 2)::integer));
    END IF;
    -- The mark that tells picks this group is held by a long run: its
    -- ready_at becomes '-infinity' (still ready, so that a pick looks at it
    -- and can reclaim it when its holder's session is gone; not indexed, so
    -- a HOT update). The pick tests the mark on values it reads anyway,
    -- which keeps groups without long runs free of any extra lookup.
    IF p_group IS NOT NULL THEN
        UPDATE pgfifo.queue_group AS g SET ready_at = '-infinity'
        WHERE g.queue = p_queue AND g.group_id = p_group /*@dist AND g.part = v_part */;
    END IF;
    token := v_token;
    lock_key := v_key;
    RETURN NEXT;
END
$$;

-- Releases a long run's session-level lock (p_key, from claim_long_run)
-- once its outcome has committed or it was given up, and the queue slot's
-- lock it kept, if any. Returns whether this session held the run's lock.
CREATE OR REPLACE FUNCTION pgfifo.unlock_long_run(p_key integer)
RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pg_advisory_unlock(1885824625, l.objid::integer)
    FROM pg_locks AS l
    WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.granted
      AND l.classid = 1885824625 AND l.objsubid = 2;
    RETURN pg_advisory_unlock(1885824620, p_key);
END
$$;

-- Extends the leases of the runs with these tokens (the holder's
-- heartbeat, from any connection).
-- (Distributed: PL/pgSQL, with the new lease taken first, since Citus
-- plans no SQL function with parameters and no volatile function in an
-- update; one update of every shard.)
CREATE OR REPLACE FUNCTION pgfifo.renew_long_runs(p_tokens bigint[], p_lease_ms integer)
RETURNS void
LANGUAGE /*@plain*/ sql /*@end*/ /*@dist plpgsql */
AS $$
    /*@dist
    DECLARE
        v_until timestamptz := clock_timestamp() + p_lease_ms * interval '1 millisecond';
    BEGIN
    UPDATE pgfifo.job_run AS r SET lease_until = v_until
    WHERE r.token = ANY (p_tokens);
    END
    */
    /*@plain*/
    UPDATE pgfifo.job_run AS r
    SET lease_until = clock_timestamp() + p_lease_ms * interval '1 millisecond'
    WHERE r.token = ANY (p_tokens)
    /*@end*/
$$;

-- Ends a long run, first thing in the job transaction that writes its
-- outcome (pgfifo.complete follows): deletes the run's row if it still
-- bears p_token, and locks the job's group row and job row as a pick
-- would have. False when the row is gone or bears another token: the run
-- was reclaimed (its holder's session was seen dead) and the job is
-- another run's; the caller must write nothing and roll back.
CREATE OR REPLACE FUNCTION pgfifo.end_long_run(p_job bigint, p_token bigint)
RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    v_queue text;
    v_group text;
    /*@dist v_part integer; */
BEGIN
    IF current_setting('pgfifo.job_transaction', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION 'pgfifo.end_long_run must run in a job transaction'
            USING ERRCODE = 'no_active_sql_transaction', CONSTRAINT = 'pgfifo_job_transaction';
    END IF;
    -- (Distributed: the run's part first, from its row; the parts of its
    -- shard then stand for a pick's in this transaction, for complete.)
    /*@dist
    SELECT r.part INTO v_part FROM pgfifo.job_run AS r
    WHERE r.job_id = p_job AND r.token = p_token;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM set_config('pgfifo.pick_parts',
                       (SELECT s.parts FROM pgfifo.layout_shard AS s WHERE v_part = ANY (s.parts))::text,
                       true);
    */
    IF NOT pgfifo.release_long_run(p_job, p_token) THEN
        RETURN false;
    END IF;
    SELECT j.queue, j.group_id INTO v_queue, v_group FROM pgfifo.job AS j WHERE j.id = p_job
      /*@dist AND j.part = v_part */;
    -- In the order a pick takes them. A pick that locked the group row
    -- since (it saw the run a moment before its end) holds it only until
    -- its own transaction commits.
    IF v_group IS NOT NULL THEN
        PERFORM 1 FROM pgfifo.queue_group AS g
        WHERE g.queue = v_queue AND g.group_id = v_group /*@dist AND g.part = v_part */ FOR UPDATE;
    END IF;
    PERFORM 1 FROM pgfifo.job AS j WHERE j.id = p_job /*@dist AND j.part = v_part */ FOR UPDATE;
    RETURN true;
END
$$;

-- Gives a long run up without an outcome (its runner shuts down): the job
-- is its group's head again and runs again. Autocommit; the caller then
-- releases the run's lock. (Also the first step of end_long_run.)
CREATE OR REPLACE FUNCTION pgfifo.release_long_run(p_job bigint, p_token bigint)
RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    v_queue text;
    v_group text;
    /*@dist v_part integer; v_now timestamptz := clock_timestamp(); */
BEGIN
    DELETE FROM pgfifo.job_run AS r WHERE r.job_id = p_job AND r.token = p_token
    RETURNING r.queue, r.group_id /*@dist , r.part */ INTO v_queue, v_group /*@dist , v_part */;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v_group IS NOT NULL THEN
        UPDATE pgfifo.queue_group AS g SET ready_at = /*@plain*/ clock_timestamp() /*@end*/ /*@dist v_now */
        WHERE g.queue = v_queue AND g.group_id = v_group AND g.ready_at = '-infinity'
          /*@dist AND g.part = v_part */;
    END IF;
    RETURN true;
END
$$;

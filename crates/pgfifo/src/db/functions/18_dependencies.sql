-- Dependencies: jobs that wait for other jobs, or for batches, to succeed.
-- See migrations/0013_dependencies and docs/batches.md ("Dependencies").
--
-- Installed whole by `migrate` (CREATE OR REPLACE) after the numbered
-- migrations; see crates/pgfifo/src/migrate.rs and docs/upgrading.md for
-- how a change of arguments or result type is made. The functions that
-- write outcomes (complete, cancel_job, skip_head) and batch_settle call
-- these only while pgfifo.job_dependency exists: after `migrate down`
-- below 13 they work as before.
--
-- A waiting dependent is a queued job whose run_after is
-- dependency_wait_at() (a fixed far future, not 'infinity': the runner
-- turns a head's start time into microseconds, and the admin views into
-- a time, which 'infinity' has neither). It holds its group like a delayed
-- head; pick and promote need nothing new for it. Its release sets
-- run_after and wakes its group through pgfifo.group_wake (as an enqueue
-- does): promote, in its own transaction with the group's row locked, sets
-- the group's ready_at from the head's new time. Nothing here waits for a
-- group's row or takes a group's advisory lock, so no new wait joins the
-- lock order of enqueue, complete and batches.
--
-- Who decides a dependent: whoever ends one of its dependencies (the hook,
-- dependency_outcomes, in the same transaction), the enqueue itself when
-- every dependency is already decided, and the sweep (release_dependents,
-- in the runner's maintenance) for the one race the hook cannot see: a
-- dependency that ends while the dependent's enqueue has not committed
-- (its rows are invisible to the hook). Every decision is taken by
-- dependency_settle with the dependent's job_wait row locked, reading the
-- dependencies' states with a snapshot taken after that lock: of two
-- transactions ending two dependencies of one job at the same moment, the
-- second to lock sees the first's commit.

-- The run_after of a waiting dependent.
CREATE OR REPLACE FUNCTION pgfifo.dependency_wait_at() RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN '9999-12-31 00:00:00+00'::timestamptz;

-- The state of one dependency, as its dependents see it: 'done' (the job
-- succeeded; the batch is closed and every job of it succeeded), 'failed'
-- (the job failed for good, was cancelled or skipped, or no longer exists;
-- the batch completed without success) or 'pending'.
CREATE OR REPLACE FUNCTION pgfifo.dependency_state(p_job bigint, p_batch bigint) RETURNS text
LANGUAGE plpgsql STABLE
-- (PL/pgSQL, not SQL: its plans are kept for the session, where a SQL
-- function called from a query is planned again on each call, 0.3 ms.)
SET jit = off
AS $$
DECLARE
    v_state text;
BEGIN
    IF p_job IS NOT NULL THEN
        SELECT j.state INTO v_state FROM pgfifo.job AS j WHERE j.id = p_job;
        RETURN CASE v_state WHEN 'succeeded' THEN 'done' WHEN 'queued' THEN 'pending' ELSE 'failed' END;
    END IF;
    SELECT CASE WHEN b.closed_at IS NULL OR pgfifo.batch_counting(b.id) THEN 'pending'
                WHEN (SELECT coalesce(sum(s.succeeded), 0) FROM pgfifo.batch_shard AS s
                      WHERE s.batch_id = b.id) = b.total THEN 'done'
                ELSE 'failed' END
    INTO v_state FROM pgfifo.batch AS b WHERE b.id = p_batch;
    RETURN coalesce(v_state, 'failed');
END
$$;

-- Decides the waiting dependents p_jobs by their dependencies' states now:
-- releases those whose dependencies are all done, cancels those with a
-- failed one under 'cancel' (and then their own dependents), marks those
-- under 'hold' as held, counts a failed one as done under 'run'. Locks
-- each one's job_wait row first (p_wait: waiting for it; else passing a
-- locked one by, as the sweep does), then its job's row without waiting (a
-- job row someone holds is left to them, or to the sweep). Returns how many
-- it released or cancelled.
CREATE OR REPLACE FUNCTION pgfifo.dependency_settle(p_jobs bigint[], p_wait boolean) RETURNS integer
LANGUAGE plpgsql
-- Short queries: compiling them would cost more than running them.
SET jit = off
-- The planner's own choices: called from complete, whose settings (no
-- sort, no sequential scan) would make it walk a whole index to join
-- a few thousand ids (measured: 3.4 s for 1,000 dependents).
SET enable_sort = on
SET enable_seqscan = on
SET enable_bitmapscan = on
AS $$
DECLARE
    v_locked    bigint[];
    v_jobs      bigint[];
    v_done      bigint[];
    v_cancelled bigint[];
    v_released  bigint[];
    -- The unsatisfied edges of v_jobs, one element each: the dependent,
    -- the dependency and its state now.
    e_job       bigint[];
    e_dep_job   bigint[];
    e_dep_batch bigint[];
    e_st        text[];
BEGIN
    -- Set-based, one statement for all of p_jobs at each step: a job that
    -- thousands wait for releases them in one pass. (Joined to unnest,
    -- not `= ANY (array)`: with thousands of dependents, that filter would
    -- be checked against every row.)
    IF p_wait THEN
        v_locked := ARRAY(SELECT w.job_id FROM pgfifo.job_wait AS w
                          JOIN unnest(p_jobs) AS t(id) ON w.job_id = t.id
                          ORDER BY w.job_id FOR UPDATE OF w);
    ELSE
        v_locked := ARRAY(SELECT w.job_id FROM pgfifo.job_wait AS w
                          JOIN unnest(p_jobs) AS t(id) ON w.job_id = t.id
                          ORDER BY w.job_id FOR UPDATE OF w SKIP LOCKED);
    END IF;
    IF cardinality(v_locked) = 0 THEN
        RETURN 0;
    END IF;
    -- Their jobs, still queued, locked without waiting (a job row someone
    -- holds is left to them, or to the sweep).
    v_jobs := ARRAY(SELECT j.id FROM pgfifo.job AS j
                    JOIN unnest(v_locked) AS t(id) ON j.id = t.id
                    WHERE j.state = 'queued'
                    ORDER BY j.id FOR NO KEY UPDATE OF j SKIP LOCKED);
    -- Those that ended otherwise (an operator cancelled one) or are gone
    -- wait no more.
    v_done := ARRAY(SELECT t.id FROM unnest(v_locked) AS t(id)
                    WHERE NOT EXISTS (SELECT 1 FROM pgfifo.job AS j
                                      WHERE j.id = t.id AND j.state = 'queued'));
    -- Each unsatisfied dependency's state, once.
    SELECT coalesce(array_agg(e.job_id ORDER BY e.job_id, e.dep_job_id, e.dep_batch_id), '{}'),
           coalesce(array_agg(e.dep_job_id ORDER BY e.job_id, e.dep_job_id, e.dep_batch_id), '{}'),
           coalesce(array_agg(e.dep_batch_id ORDER BY e.job_id, e.dep_job_id, e.dep_batch_id), '{}'),
           coalesce(array_agg(e.st ORDER BY e.job_id, e.dep_job_id, e.dep_batch_id), '{}')
    INTO e_job, e_dep_job, e_dep_batch, e_st
    FROM (SELECT d.job_id, d.dep_job_id, d.dep_batch_id,
                 pgfifo.dependency_state(d.dep_job_id, d.dep_batch_id) AS st
          FROM unnest(v_jobs) AS t(id)
          JOIN pgfifo.job_dependency AS d ON d.job_id = t.id
          WHERE NOT d.satisfied) AS e;
    -- Cancelled: a failed one under 'cancel' (the reason names the first).
    WITH failed AS (
        SELECT DISTINCT ON (e.job) e.job, e.dj, e.db
        FROM unnest(e_job, e_dep_job, e_dep_batch, e_st) AS e(job, dj, db, st)
        JOIN pgfifo.job_wait AS w ON w.job_id = e.job
        WHERE e.st = 'failed' AND w.on_failure = 'cancel'
        ORDER BY e.job, e.dj, e.db),
    ended AS (
        UPDATE pgfifo.job AS j
        SET state = 'cancelled', finished_at = now(),
            last_error = CASE WHEN f.dj IS NOT NULL
                              THEN format('dependency job %s %s', f.dj,
                                          coalesce((SELECT x.state FROM pgfifo.job AS x WHERE x.id = f.dj),
                                                   'no longer exists'))
                              ELSE format('dependency batch %s completed without success', f.db) END
        FROM failed AS f
        WHERE j.id = f.job
        RETURNING j.id)
    SELECT coalesce(array_agg(ended.id ORDER BY ended.id), '{}') INTO v_cancelled FROM ended;
    -- Done ones (and failed ones under 'run') count for good.
    UPDATE pgfifo.job_dependency AS d SET satisfied = true
    FROM unnest(e_job, e_dep_job, e_dep_batch, e_st) AS e(job, dj, db, st)
    JOIN pgfifo.job_wait AS w ON w.job_id = e.job
    WHERE d.job_id = e.job AND NOT d.satisfied
      AND d.dep_job_id IS NOT DISTINCT FROM e.dj AND d.dep_batch_id IS NOT DISTINCT FROM e.db
      AND (e.st = 'done' OR (e.st = 'failed' AND w.on_failure = 'run'));
    -- Held ones say by what (the first failed one); waiting ones whose
    -- failed dependency was retried are held no more.
    UPDATE pgfifo.job_wait AS w
    SET blocked_by_job = f.dj, blocked_by_batch = f.db
    FROM (SELECT t.id AS job, h.dj, h.db
          FROM unnest(v_jobs) AS t(id)
          LEFT JOIN (SELECT DISTINCT ON (e.job) e.job, e.dj, e.db
                     FROM unnest(e_job, e_dep_job, e_dep_batch, e_st) AS e(job, dj, db, st)
                     WHERE e.st = 'failed' ORDER BY e.job, e.dj, e.db) AS h ON h.job = t.id) AS f
    WHERE w.job_id = f.job AND w.on_failure = 'hold'
      AND (w.blocked_by_job IS DISTINCT FROM f.dj OR w.blocked_by_batch IS DISTINCT FROM f.db);
    -- Released: nothing left to wait for; their own start time.
    WITH free AS (
        UPDATE pgfifo.job AS j SET run_after = coalesce(w.run_after, now())
        FROM unnest(v_jobs) AS t(id)
        JOIN pgfifo.job_wait AS w ON w.job_id = t.id
        -- (A job cancelled above is no longer queued.)
        WHERE j.id = t.id AND j.state = 'queued'
          AND NOT EXISTS (SELECT 1 FROM pgfifo.job_dependency AS d
                          WHERE d.job_id = t.id AND NOT d.satisfied)
        RETURNING j.id)
    SELECT coalesce(array_agg(free.id ORDER BY free.id), '{}') INTO v_released FROM free;
    -- Their groups woken (a cancelled head is moved on by promote, see
    -- there), and runners told of the ungrouped ones released.
    INSERT INTO pgfifo.group_wake (queue, group_id)
    SELECT DISTINCT j.queue, j.group_id FROM pgfifo.job AS j
    JOIN unnest(v_released || v_cancelled) AS t(id) ON j.id = t.id
    WHERE j.group_id IS NOT NULL;
    PERFORM pg_notify('pgfifo_groups', s.queue)
    FROM (SELECT DISTINCT j.queue FROM pgfifo.job AS j
          JOIN unnest(v_released || v_cancelled) AS t(id) ON j.id = t.id
          WHERE j.group_id IS NOT NULL) AS s;
    PERFORM pg_notify('pgfifo', s.queue)
    FROM (SELECT DISTINCT j.queue FROM pgfifo.job AS j
          JOIN unnest(v_released) AS t(id) ON j.id = t.id
          WHERE j.group_id IS NULL) AS s;
    -- They wait no more.
    DELETE FROM pgfifo.job_dependency AS d
    USING unnest(v_released || v_cancelled || v_done) AS t(id) WHERE d.job_id = t.id;
    DELETE FROM pgfifo.job_wait AS w
    USING unnest(v_released || v_cancelled || v_done) AS t(id) WHERE w.job_id = t.id;
    IF cardinality(v_cancelled) > 0 THEN
        -- (Dependents are never members of a batch today, see
        -- enqueue_after: this counts nothing, and locks no batch.)
        IF to_regclass('pgfifo.batch_job') IS NOT NULL THEN
            PERFORM pgfifo.batch_outcomes(v_cancelled, array_fill('cancelled'::text, ARRAY[cardinality(v_cancelled)]));
        END IF;
        -- Their own dependents, in turn (no cycle: a dependency exists
        -- before its dependent).
        PERFORM pgfifo.dependency_outcomes(v_cancelled,
                                           array_fill('cancelled'::text, ARRAY[cardinality(v_cancelled)]));
    END IF;
    RETURN cardinality(v_released) + cardinality(v_cancelled);
END
$$;

-- The hook: jobs p_ids reached outcomes p_outcomes (as complete takes
-- them; only 'succeeded', 'failed' and 'cancelled' decide anything).
-- Decides their waiting dependents, and a job among them that was itself
-- waiting (an operator cancelled or skipped it) waits no more. Called in
-- the caller's transaction after the jobs' rows were written, while
-- pgfifo.job_dependency exists (see complete for the probe that skips it
-- when nobody waits).
CREATE OR REPLACE FUNCTION pgfifo.dependency_outcomes(p_ids bigint[], p_outcomes text[]) RETURNS void
LANGUAGE plpgsql
-- Short queries: compiling them would cost more than running them.
SET jit = off
-- The planner's own choices, not complete's (see dependency_settle).
SET enable_sort = on
SET enable_seqscan = on
SET enable_bitmapscan = on
AS $$
DECLARE
    v_ended     bigint[];
    v_dependent bigint[];
BEGIN
    v_ended := ARRAY(SELECT t.id FROM unnest(p_ids, p_outcomes) AS t(id, outcome)
                     WHERE t.outcome IN ('succeeded', 'failed', 'cancelled'));
    IF cardinality(v_ended) = 0 THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM pgfifo.job_wait AS w WHERE w.job_id = ANY (v_ended)) THEN
        DELETE FROM pgfifo.job_dependency WHERE job_id = ANY (v_ended);
        DELETE FROM pgfifo.job_wait WHERE job_id = ANY (v_ended);
    END IF;
    v_dependent := ARRAY(SELECT DISTINCT d.job_id FROM pgfifo.job_dependency AS d
                         WHERE d.dep_job_id = ANY (v_ended) ORDER BY 1);
    IF cardinality(v_dependent) > 0 THEN
        PERFORM pgfifo.dependency_settle(v_dependent, true);
    END IF;
END
$$;

-- The hook of batches: batch p_batch fired its events (batch_settle, with
-- the batch's row locked). Decides its waiting dependents.
CREATE OR REPLACE FUNCTION pgfifo.dependency_batch_settled(p_batch bigint) RETURNS void
LANGUAGE plpgsql
-- Short queries: compiling them would cost more than running them.
SET jit = off
-- The planner's own choices, not complete's (see dependency_settle).
SET enable_sort = on
SET enable_seqscan = on
SET enable_bitmapscan = on
AS $$
DECLARE
    v_dependent bigint[];
BEGIN
    v_dependent := ARRAY(SELECT DISTINCT d.job_id FROM pgfifo.job_dependency AS d
                         WHERE d.dep_batch_id = p_batch ORDER BY 1);
    IF cardinality(v_dependent) > 0 THEN
        PERFORM pgfifo.dependency_settle(v_dependent, true);
    END IF;
END
$$;

-- The sweep: decides the waiting dependents that a hook missed (their
-- enqueue committed after a dependency's end, or a hook passed their
-- locked row by): those with a dependency decided but not counted, or none
-- left to wait for. Held ones (and ones still waiting) are not decided
-- again, so a backlog of them does not hide the rest. It looks at up to
-- p_scan waiting dependents after job id p_after (the caller goes round
-- the table a page per call: a sweep's cost stays bounded however many
-- wait). settled: how many it released or cancelled; next_after: where
-- the next call starts (0: from the start again). Passes locked rows by.
-- Called by the runner's maintenance, in its own transaction.
CREATE OR REPLACE FUNCTION pgfifo.release_dependents(
    p_after        bigint,
    p_scan         integer,
    OUT settled    integer,
    OUT next_after bigint
)
LANGUAGE plpgsql
-- Short queries: compiling them would cost more than running them.
SET jit = off
AS $$
DECLARE
    v_last bigint;
    v_n    bigint;
    v_due  bigint[];
BEGIN
    settled := 0;
    next_after := 0;
    IF to_regclass('pgfifo.job_wait') IS NULL THEN
        RETURN;
    END IF;
    -- The page: job ids from p_after (excluded) to v_last (included).
    SELECT max(p.job_id), count(*) INTO v_last, v_n
    FROM (SELECT w.job_id FROM pgfifo.job_wait AS w
          WHERE w.job_id > coalesce(p_after, 0) ORDER BY w.job_id LIMIT p_scan) AS p;
    IF v_n = 0 THEN
        RETURN;
    END IF;
    IF v_n = p_scan THEN
        next_after := v_last;
    END IF;
    -- Each dependent's edges in one pass (an index scan of its edges and
    -- a look-up of each dependency job; dependency_state only for batches,
    -- whose edges are few): no plan here reads a whole table.
    v_due := ARRAY(
        SELECT w.job_id FROM pgfifo.job_wait AS w
        CROSS JOIN LATERAL (
            SELECT count(*) FILTER (WHERE NOT d.satisfied) AS open,
                   coalesce(bool_or(
                       CASE WHEN d.satisfied THEN false
                            WHEN d.dep_job_id IS NOT NULL
                            -- A job that ended: any, unless this one is
                            -- held already (then only a success counts).
                            THEN coalesce(j.state, 'gone') <> 'queued'
                                 AND (w.on_failure <> 'hold'
                                      OR (w.blocked_by_job IS NULL AND w.blocked_by_batch IS NULL)
                                      OR j.state = 'succeeded')
                            ELSE pgfifo.dependency_state(NULL, d.dep_batch_id) = 'done'
                                 OR (pgfifo.dependency_state(NULL, d.dep_batch_id) = 'failed'
                                     AND (w.on_failure <> 'hold'
                                          OR (w.blocked_by_job IS NULL AND w.blocked_by_batch IS NULL)))
                       END), false) AS decided
            FROM pgfifo.job_dependency AS d
            LEFT JOIN pgfifo.job AS j ON j.id = d.dep_job_id
            WHERE d.job_id = w.job_id) AS e
        WHERE w.job_id > coalesce(p_after, 0) AND w.job_id <= v_last
          AND (e.open = 0 OR e.decided
               -- A held one whose failed dependency was retried.
               OR (w.blocked_by_job IS NOT NULL
                   AND (SELECT j.state FROM pgfifo.job AS j WHERE j.id = w.blocked_by_job)
                       IN ('queued', 'succeeded'))
               OR (w.blocked_by_batch IS NOT NULL
                   AND pgfifo.dependency_state(NULL, w.blocked_by_batch) <> 'failed'))
        ORDER BY w.job_id);
    IF cardinality(v_due) > 0 THEN
        settled := pgfifo.dependency_settle(v_due, false);
    END IF;
END
$$;

-- Enqueues jobs as pgfifo.enqueue does (the same arguments, without unique
-- keys: a row whose key is taken would return another job's id), each with
-- its dependencies: edge k says that row p_dep_row[k] (1-based) waits for
-- job p_dep_job[k] or for batch p_dep_batch[k] (exactly one of the two).
-- p_on_failure[i] is row i's policy when a dependency fails for good, is
-- cancelled or skipped: 'cancel' (NULL: the default), 'hold' or 'run'.
-- A row without edges is an ordinary job. Returns the ids in input order.
--
-- Dependencies must exist (so no cycle can be made): a missing one raises
-- pgfifo_dependency_missing (DETAIL 'job 17' or 'batch 5'), writing
-- nothing. A dependency that succeeded already counts as done; one that
-- failed already applies the policy now: under 'cancel' the job is created
-- cancelled (its id is valid, its group is not held), under 'hold' it
-- waits, held. A row whose dependencies are all done is enqueued as if it
-- had none. A dependent is never a member of a batch.
CREATE OR REPLACE FUNCTION pgfifo.enqueue_after(
    p_queue        text[],
    p_group        text[],
    p_kind         text[],
    p_payload      jsonb[],
    p_priority     smallint[],
    p_max_attempts integer[],
    p_run_at_us    bigint[],
    p_delay_us     bigint[],
    p_on_failure   text[],
    p_dep_row      integer[],
    p_dep_job      bigint[],
    p_dep_batch    bigint[]
) RETURNS bigint[]
LANGUAGE plpgsql
-- Short queries: compiling them would cost more than running them.
SET jit = off
AS $$
DECLARE
    v_n       integer := coalesce(cardinality(p_queue), 0);
    v_e       integer := coalesce(cardinality(p_dep_row), 0);
    v_policy  text[];
    v_fate    text[];
    v_own_at  timestamptz[];
    v_run_at  bigint[] := p_run_at_us;
    v_delay   bigint[] := p_delay_us;
    v_wait_us bigint := (extract(epoch FROM pgfifo.dependency_wait_at()) * 1000000)::bigint;
    v_ids     bigint[];
    v_bad     record;
    v_st      text[];
BEGIN
    /*@dist PERFORM pgfifo.not_distributed('dependencies'); */
    PERFORM pgfifo.require_read_committed('enqueue');
    IF v_n <> coalesce(cardinality(p_group), 0) OR v_n <> coalesce(cardinality(p_kind), 0)
       OR v_n <> coalesce(cardinality(p_payload), 0) OR v_n <> coalesce(cardinality(p_priority), 0)
       OR v_n <> coalesce(cardinality(p_max_attempts), 0)
       OR v_n <> coalesce(cardinality(p_run_at_us), 0) OR v_n <> coalesce(cardinality(p_delay_us), 0)
       OR (p_on_failure IS NOT NULL AND v_n <> cardinality(p_on_failure))
       OR v_e <> coalesce(cardinality(p_dep_job), 0) OR v_e <> coalesce(cardinality(p_dep_batch), 0) THEN
        RAISE EXCEPTION 'pgfifo enqueue_after: the arrays of jobs, and those of dependencies, must each have one length'
            USING ERRCODE = 'invalid_parameter_value', CONSTRAINT = 'pgfifo_dependency_invalid';
    END IF;
    IF v_n = 0 THEN
        RETURN '{}';
    END IF;
    v_policy := ARRAY(SELECT coalesce(p, 'cancel')
                      FROM unnest(coalesce(p_on_failure, array_fill(NULL::text, ARRAY[v_n])))
                           WITH ORDINALITY AS t(p, i) ORDER BY i);
    IF NOT v_policy <@ ARRAY['cancel', 'hold', 'run'] THEN
        RAISE EXCEPTION 'pgfifo enqueue_after: on_failure must be cancel, hold or run (got %)', p_on_failure
            USING ERRCODE = 'invalid_parameter_value', CONSTRAINT = 'pgfifo_dependency_invalid';
    END IF;
    SELECT t.r, t.j, t.b INTO v_bad FROM unnest(p_dep_row, p_dep_job, p_dep_batch) AS t(r, j, b)
    WHERE t.r IS NULL OR t.r < 1 OR t.r > v_n OR (t.j IS NULL) = (t.b IS NULL) LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'pgfifo enqueue_after: a dependency must name a row between 1 and % and exactly one job or batch (got row %, job %, batch %)',
            v_n, v_bad.r, v_bad.j, v_bad.b
            USING ERRCODE = 'invalid_parameter_value', CONSTRAINT = 'pgfifo_dependency_invalid';
    END IF;
    -- Dependencies exist (read without locks: one that ends meanwhile is
    -- decided by its hook or by the sweep once this commits).
    SELECT t.j, t.b INTO v_bad FROM unnest(p_dep_job, p_dep_batch) AS t(j, b)
    WHERE (t.j IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pgfifo.job AS x WHERE x.id = t.j))
       OR (t.b IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pgfifo.batch AS x WHERE x.id = t.b))
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'pgfifo enqueue_after: the dependency % does not exist',
            CASE WHEN v_bad.j IS NOT NULL THEN 'job ' || v_bad.j ELSE 'batch ' || v_bad.b END
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'pgfifo_dependency_missing',
                  DETAIL = CASE WHEN v_bad.j IS NOT NULL THEN 'job ' || v_bad.j ELSE 'batch ' || v_bad.b END;
    END IF;
    -- Each edge's state now, and each row's fate: 'plain' (no edges, or all
    -- done), 'wait' or 'cancel'. (Rows and edges are joined by position
    -- through unnest: a subscript of a text array, or of one with NULLs,
    -- inside a query walks the array, which would make a large call
    -- quadratic.)
    v_st := ARRAY(SELECT pgfifo.dependency_state(t.j, t.b)
                  FROM unnest(p_dep_job, p_dep_batch) WITH ORDINALITY AS t(j, b, k) ORDER BY t.k);
    v_fate := ARRAY(
        SELECT CASE
                   WHEN bool_or(e.st = 'failed') AND r.policy = 'cancel' THEN 'cancel'
                   WHEN bool_and(e.st = 'done' OR (e.st = 'failed' AND r.policy = 'run'))
                        OR count(e.st) = 0 THEN 'plain'
                   ELSE 'wait' END
        FROM unnest(v_policy) WITH ORDINALITY AS r(policy, i)
        LEFT JOIN unnest(p_dep_row, v_st) AS e(r, st) ON e.r = r.i
        GROUP BY r.i, r.policy ORDER BY r.i);
    v_own_at := ARRAY(SELECT CASE WHEN t.at IS NULL AND t.dl IS NULL THEN NULL
                                  ELSE pgfifo.run_after(t.at, t.dl) END
                      FROM unnest(p_run_at_us, p_delay_us) WITH ORDINALITY AS t(at, dl, i) ORDER BY i);
    v_run_at := ARRAY(SELECT CASE WHEN t.f = 'plain' THEN t.at ELSE v_wait_us END
                      FROM unnest(v_fate, p_run_at_us) WITH ORDINALITY AS t(f, at, i) ORDER BY i);
    v_delay := ARRAY(SELECT CASE WHEN t.f = 'plain' THEN t.dl END
                     FROM unnest(v_fate, p_delay_us) WITH ORDINALITY AS t(f, dl, i) ORDER BY i);
    v_ids := pgfifo.enqueue(p_queue, p_group, p_kind, p_payload, p_priority, p_max_attempts,
                            NULL, v_run_at, v_delay);
    INSERT INTO pgfifo.job_wait (job_id, on_failure, run_after)
    SELECT r.id, r.policy, r.own_at
    FROM unnest(v_ids, v_policy, v_fate, v_own_at) AS r(id, policy, fate, own_at)
    WHERE r.fate = 'wait';
    INSERT INTO pgfifo.job_dependency (job_id, dep_job_id, dep_batch_id, satisfied)
    SELECT r.id, e.j, e.b, e.st = 'done' OR (e.st = 'failed' AND r.policy = 'run')
    FROM unnest(p_dep_row, p_dep_job, p_dep_batch, v_st) AS e(r, j, b, st)
    JOIN unnest(v_ids, v_policy, v_fate) WITH ORDINALITY AS r(id, policy, fate, i) ON r.i = e.r
    WHERE r.fate = 'wait';
    -- Held ones say by what; cancelled ones are created ended (their
    -- groups' wake rows find nothing to run, or a head to move on).
    UPDATE pgfifo.job_wait AS w SET blocked_by_job = f.j, blocked_by_batch = f.b
    FROM (SELECT DISTINCT ON (r.id) r.id, e.j, e.b
          FROM unnest(p_dep_row, p_dep_job, p_dep_batch, v_st) AS e(r, j, b, st)
          JOIN unnest(v_ids, v_policy, v_fate) WITH ORDINALITY AS r(id, policy, fate, i) ON r.i = e.r
          WHERE e.st = 'failed' AND r.policy = 'hold' AND r.fate = 'wait'
          ORDER BY r.id, e.j, e.b) AS f
    WHERE w.job_id = f.id;
    UPDATE pgfifo.job AS j
    SET state = 'cancelled', finished_at = now(),
        last_error = CASE WHEN f.j IS NOT NULL
                          THEN format('dependency job %s %s', f.j,
                                      (SELECT x.state FROM pgfifo.job AS x WHERE x.id = f.j))
                          ELSE format('dependency batch %s completed without success', f.b) END
    FROM (SELECT DISTINCT ON (r.id) r.id, e.j, e.b
          FROM unnest(p_dep_row, p_dep_job, p_dep_batch, v_st) AS e(r, j, b, st)
          JOIN unnest(v_ids, v_fate) WITH ORDINALITY AS r(id, fate, i) ON r.i = e.r
          WHERE e.st = 'failed' AND r.fate = 'cancel'
          ORDER BY r.id, e.j, e.b) AS f
    WHERE j.id = f.id;
    RETURN v_ids;
END
$$;

-- Batches: jobs counted together, and callbacks enqueued when their
-- outcomes decide an event. See migrations/0012_batches and docs/batches.md.
--
-- Installed whole by `migrate` (CREATE OR REPLACE) after the numbered
-- migrations; see crates/pgfifo/src/migrate.rs and docs/upgrading.md for
-- how a change of arguments or result type is made. The functions that
-- write outcomes (complete, cancel_job, skip_head, retry_jobs) call these
-- only while pgfifo.batch_job exists: after `migrate down` below 12 they
-- work as before.
--
-- Counting. A batch's counts are kept in up to 64 shards
-- (pgfifo.batch_shard): its jobs without a terminal outcome are spread
-- over them as numbers, and a transaction that ends k of them takes k off
-- one shard that no other transaction holds (see batch_take, in
-- 17_batches_take.sql), so runners
-- ending a batch's jobs at the same moment update different rows. The
-- transaction that brings a shard to 0 looks for another shard with jobs
-- left that no transaction holds, and locks it for share: that shard's
-- last taker comes after it. Finding none, it locks the batch's row and
-- reads the shards again: when none has jobs left (every transaction that
-- emptied one committed before, or queued for the row and decides after),
-- and the batch is closed, it decides 'complete' (and 'success'), under
-- that lock. The first failure decides 'failure' under the batch's row
-- lock too (first_failed_at set once). The events'
-- callbacks are enqueued there, and their job ids recorded, so each one is
-- enqueued once; a transaction that rolls back (a crash, a lost
-- connection) takes its counts and its callbacks with it.
--
-- Lock order: shard rows (a completion's first choice without waiting;
-- any wait in (batch, shard) order), then batch rows (in id order), in
-- every function here: complete, cancel_job, skip_head,
-- retry_jobs, adding jobs and closing. A completion takes them after its
-- jobs' rows and before it moves its groups' heads (advance_head takes a
-- group's exclusive advisory lock, without waiting): a callback's enqueue,
-- which waits for that advisory lock shared, never waits for a transaction
-- that waits for a batch's row. Adding jobs enqueues them first and locks
-- the batch's rows last, for the same reason.

-- Whether some of batch p_batch's jobs have no terminal outcome yet (as
-- committed, and as this transaction counted): some shard has jobs left.
-- (pgfifo.batch's columns shards and shards_done are no longer kept up to
-- date by 0.3.0's functions: the shards say it.)
CREATE OR REPLACE FUNCTION pgfifo.batch_counting(p_batch bigint) RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM pgfifo.batch_shard AS s
                   WHERE s.batch_id = p_batch AND s.remaining > 0);
END
$$;

-- The batch of job p_id, or NULL. For the runner's pick statement, which
-- reads each picked job's batch: a plpgsql function (never inlined, and
-- volatile) runs its query with a snapshot taken now, after pick locked
-- the job. A subquery of the pick statement would read the statement's
-- own snapshot, taken before pick ran, and miss the batch of a job whose
-- enqueue committed meanwhile: that job's end would then not be counted,
-- and its batch would never complete.
CREATE OR REPLACE FUNCTION pgfifo.job_batch(p_id bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
-- (Distributed: the pick's shard, in a variable: Citus routes a statement
-- by its part only when the part is a constant or a parameter.)
/*@dist DECLARE v_parts integer[] := nullif(current_setting('pgfifo.pick_parts', true), '')::integer[]; */
BEGIN
    -- (Distributed: no batches yet, so no statement per job for them.)
    /*@dist RETURN NULL; */
    RETURN (SELECT b.batch_id FROM pgfifo.batch_job AS b WHERE b.job_id = p_id
            /*@dist AND b.part = ANY (v_parts) */);
END
$$;

-- Fires the events that p_batch's counts decide and that have not fired:
-- enqueues their callbacks (through pgfifo.enqueue, which wakes runners
-- when the transaction commits) and records the callbacks' job ids. The
-- caller holds the batch's row locked. Events:
--   failure:  some job failed for good;
--   complete: the batch is closed and every job has a terminal outcome
--             (sets completed_at, once);
--   success:  the batch is closed and every job succeeded.
-- Several at once are enqueued in the order failure, success, complete.
CREATE OR REPLACE FUNCTION pgfifo.batch_settle(p_batch bigint) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_b      record;
    v_cb     record;
    v_events text[] := '{}';
    v_id     bigint;
    v_done   boolean;
    v_ok     bigint;
BEGIN
    SELECT b.closed_at, b.completed_at, b.first_failed_at, b.total
    INTO v_b FROM pgfifo.batch AS b WHERE b.id = p_batch;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_b.first_failed_at IS NOT NULL THEN
        v_events := v_events || 'failure'::text;
    END IF;
    v_done := v_b.closed_at IS NOT NULL AND NOT pgfifo.batch_counting(p_batch);
    IF v_done THEN
        v_events := v_events || 'complete'::text;
        IF v_b.completed_at IS NULL THEN
            UPDATE pgfifo.batch SET completed_at = clock_timestamp() WHERE id = p_batch;
        END IF;
        -- Every shard is done, each by a transaction that committed before
        -- this statement, or by this one: the sum is exact.
        SELECT coalesce(sum(s.succeeded), 0) INTO v_ok
        FROM pgfifo.batch_shard AS s WHERE s.batch_id = p_batch;
        IF v_ok = v_b.total THEN
            v_events := v_events || 'success'::text;
        END IF;
    END IF;
    IF cardinality(v_events) = 0 THEN
        RETURN;
    END IF;
    FOR v_cb IN
        SELECT c.event, c.queue, c.group_id, c.kind, c.payload, c.priority, c.max_attempts
        FROM pgfifo.batch_callback AS c
        WHERE c.batch_id = p_batch AND c.event = ANY (v_events) AND c.job_id IS NULL
        ORDER BY array_position(ARRAY['failure', 'success', 'complete'], c.event)
    LOOP
        v_id := (pgfifo.enqueue(ARRAY[v_cb.queue], ARRAY[v_cb.group_id], ARRAY[v_cb.kind],
                                ARRAY[v_cb.payload], ARRAY[v_cb.priority], ARRAY[v_cb.max_attempts],
                                NULL, ARRAY[NULL::bigint], ARRAY[NULL::bigint]))[1];
        UPDATE pgfifo.batch_callback SET job_id = v_id
        WHERE batch_id = p_batch AND event = v_cb.event;
    END LOOP;
    -- Jobs that wait for the batch (18_dependencies.sql; two IFs, see
    -- complete).
    IF v_done AND to_regclass('pgfifo.job_dependency') IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM pgfifo.job_wait) THEN
            PERFORM pgfifo.dependency_batch_settled(p_batch);
        END IF;
    END IF;
END
$$;

-- p_n jobs join batch p_batch's counts as remaining (new jobs, or failed
-- jobs an operator retried: p_failed of them leave 'failed'), spread over
-- its 64 shards (shard i takes the i-th share). Locks the shard rows in
-- shard order; batch_count_jobs locks the batch's row after.
CREATE OR REPLACE FUNCTION pgfifo.batch_count_shards(p_batch bigint, p_n integer, p_failed integer)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_before  integer;
    v_share   integer;
BEGIN
    FOR v_shard IN 0 .. least(p_n, 64) - 1 LOOP
        v_share := p_n / 64 + CASE WHEN v_shard < p_n % 64 THEN 1 ELSE 0 END;
        SELECT s.remaining INTO v_before FROM pgfifo.batch_shard AS s
        WHERE s.batch_id = p_batch AND s.shard = v_shard
        FOR UPDATE;
        IF NOT FOUND THEN
            INSERT INTO pgfifo.batch_shard (batch_id, shard, remaining)
            VALUES (p_batch, v_shard, v_share);
        ELSE
            UPDATE pgfifo.batch_shard SET remaining = remaining + v_share
            WHERE batch_id = p_batch AND shard = v_shard;
        END IF;
        -- Retried jobs leave 'failed' (on any shard: only sums mean
        -- something).
        IF v_shard = 0 AND p_failed > 0 THEN
            UPDATE pgfifo.batch_shard SET failed = failed - p_failed
            WHERE batch_id = p_batch AND shard = 0;
        END IF;
    END LOOP;
END
$$;

-- p_n jobs join batch p_batch's counts (batch_count_shards), then its row
-- (total); returns the batch's closed_at (NULL: open), or raises
-- pgfifo_batch_missing. The caller checks that the batch may take them.
CREATE OR REPLACE FUNCTION pgfifo.batch_count_jobs(p_batch bigint, p_n integer, p_failed integer)
RETURNS timestamptz
LANGUAGE plpgsql
AS $$
DECLARE
    v_closed  timestamptz;
BEGIN
    -- (Read without a lock: the lock comes after the shards'.)
    IF NOT EXISTS (SELECT 1 FROM pgfifo.batch AS b WHERE b.id = p_batch) THEN
        RAISE EXCEPTION 'pgfifo batch: no batch has id %', p_batch
            USING ERRCODE = 'no_data_found', CONSTRAINT = 'pgfifo_batch_missing',
                  DETAIL = p_batch::text;
    END IF;
    PERFORM pgfifo.batch_count_shards(p_batch, p_n, p_failed);
    UPDATE pgfifo.batch AS b
    SET total = b.total + p_n - p_failed
    WHERE b.id = p_batch
    RETURNING b.closed_at INTO v_closed;
    RETURN v_closed;
END
$$;

-- Counts the terminal outcomes among p_outcomes ('succeeded', 'failed',
-- 'cancelled'; others are ignored) of the jobs p_ids that belong to a
-- batch, and fires the events they decide. Called by the functions that
-- write outcomes, in their transaction, with the jobs' rows held. Callers
-- pass a job only when it reaches a terminal outcome (from queued or
-- running), so each job counts once per time it ends. (complete, whose
-- runner read each job's batch at its pick, calls batch_count_outcomes
-- with the batches instead.)
CREATE OR REPLACE FUNCTION pgfifo.batch_outcomes(p_ids bigint[], p_outcomes text[]) RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_bids    bigint[];
    v_outs    text[];
BEGIN
    -- Each ended job's batch, by its primary key (grouped and ordered over
    -- a join, the plan would read the batch's every job in batch_id order,
    -- since sorts are off in complete).
    SELECT array_agg(m.batch_id), array_agg(t.outcome)
    INTO v_bids, v_outs
    FROM unnest(p_ids, p_outcomes) AS t(id, outcome)
    CROSS JOIN LATERAL (SELECT x.batch_id FROM pgfifo.batch_job AS x
                        WHERE x.job_id = t.id) AS m;
    IF v_bids IS NOT NULL THEN
        PERFORM pgfifo.batch_count_outcomes(v_bids, v_outs);
    END IF;
END
$$;

-- Counts outcome p_outcomes[i] of a job of batch p_batches[i] (NULL: of no
-- batch; outcomes other than 'succeeded', 'failed' and 'cancelled' are
-- ignored), and fires the events they decide: batch_outcomes with the
-- jobs' batches known (see there). The arrays are as long as each other.
CREATE OR REPLACE FUNCTION pgfifo.batch_count_outcomes(p_batches bigint[], p_outcomes text[]) RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_row     record;
    v_bids    bigint[] := p_batches;
    v_outs    text[] := p_outcomes;
    v_s       integer;
    v_f       integer;
    v_c       integer;
    v_batches bigint[] := '{}';
    v_emptied integer[] := '{}';
    v_failed  boolean[] := '{}';
    v_i       integer;
    v_due     boolean;
BEGIN
    -- Only the terminal outcomes of jobs in batches. (Array expressions
    -- when nothing is left out, the common case: no executor.)
    IF array_position(v_bids, NULL) IS NOT NULL
       OR NOT v_outs <@ ARRAY['succeeded', 'failed', 'cancelled'] THEN
        SELECT array_agg(t.batch_id), array_agg(t.outcome)
        INTO v_bids, v_outs
        FROM unnest(p_batches, p_outcomes) AS t(batch_id, outcome)
        WHERE t.batch_id IS NOT NULL AND t.outcome IN ('succeeded', 'failed', 'cancelled');
        IF v_bids IS NULL THEN
            RETURN;
        END IF;
    END IF;
    -- The shards' rows, batch by batch in id order. One batch (the common
    -- case) is counted from the arrays, without a grouping query: array
    -- expressions need no executor.
    IF v_bids[1] = ALL (v_bids) THEN
        v_s := coalesce(cardinality(array_positions(v_outs, 'succeeded')), 0);
        v_f := coalesce(cardinality(array_positions(v_outs, 'failed')), 0);
        v_c := cardinality(v_outs) - v_s - v_f;
        v_batches := ARRAY[v_bids[1]];
        v_emptied := ARRAY[pgfifo.batch_take(v_bids[1], v_s + v_f + v_c, v_s, v_f, v_c)];
        v_failed := ARRAY[v_f > 0];
    ELSE
        FOR v_row IN
            SELECT t.batch_id,
                   count(*) FILTER (WHERE t.outcome = 'succeeded')::integer AS s,
                   count(*) FILTER (WHERE t.outcome = 'failed')::integer AS f,
                   count(*) FILTER (WHERE t.outcome = 'cancelled')::integer AS c
            FROM unnest(v_bids, v_outs) AS t(batch_id, outcome)
            GROUP BY 1
            ORDER BY 1
        LOOP
            v_batches := v_batches || v_row.batch_id;
            v_emptied := v_emptied
                         || pgfifo.batch_take(v_row.batch_id, v_row.s + v_row.f + v_row.c, v_row.s, v_row.f, v_row.c);
            v_failed := v_failed || (v_row.f > 0);
        END LOOP;
    END IF;
    -- The batches' rows, in id order: only at a batch's first failure, or
    -- when a shard ran out of jobs and no other shard that nobody holds has
    -- any left (most calls end above). Such a shard is locked for share
    -- here: whoever takes its last jobs does so after this transaction
    -- commits, and decides then; so only the transactions that may end a
    -- batch queue for its row, not every one that empties a shard.
    FOR v_i IN 1 .. cardinality(v_batches) LOOP
        v_due := false;
        IF v_failed[v_i] THEN
            -- (Read first without a lock: after the first failure, the
            -- later ones need not lock the batch.)
            v_due := EXISTS (SELECT 1 FROM pgfifo.batch AS b
                             WHERE b.id = v_batches[v_i] AND b.first_failed_at IS NULL);
        END IF;
        IF v_emptied[v_i] > 0 AND NOT v_due THEN
            PERFORM 1 FROM pgfifo.batch_shard AS s
            WHERE s.batch_id = v_batches[v_i] AND s.remaining > 0
            LIMIT 1
            FOR SHARE SKIP LOCKED;
            v_due := NOT FOUND;
        END IF;
        CONTINUE WHEN NOT v_due;
        UPDATE pgfifo.batch AS b
        SET first_failed_at = CASE WHEN v_failed[v_i] THEN coalesce(b.first_failed_at, clock_timestamp())
                                   ELSE b.first_failed_at END
        WHERE b.id = v_batches[v_i];
        -- (batch_settle reads the shards again, with the row locked: it
        -- sees every transaction that emptied one before this one.)
        PERFORM pgfifo.batch_settle(v_batches[v_i]);
    END LOOP;
END
$$;

-- Failed jobs p_ids that an operator put back in their queues (retry_jobs)
-- no longer count as failed in their batches: they are remaining again,
-- and count when they end. Callbacks that fired stay fired; 'success',
-- if it has not fired, may still fire when the retried jobs succeed.
CREATE OR REPLACE FUNCTION pgfifo.batch_retried(p_ids bigint[]) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_row     record;
BEGIN
    -- Only the batches' shards, batches in id order; their rows are left
    -- alone (the batches' totals do not change). Locking each batch's row
    -- after its shards, as adding jobs does, could hold one batch's row
    -- while waiting for another batch's shard that a completion holds
    -- while it waits for that row (completions take every batch's shards,
    -- then the rows).
    FOR v_row IN
        WITH member AS MATERIALIZED (
            SELECT m.batch_id FROM unnest(p_ids) AS t(id)
            CROSS JOIN LATERAL (SELECT x.batch_id FROM pgfifo.batch_job AS x
                                WHERE x.job_id = t.id) AS m)
        SELECT member.batch_id, count(*)::integer AS n FROM member
        GROUP BY 1 ORDER BY 1
    LOOP
        PERFORM pgfifo.batch_count_shards(v_row.batch_id, v_row.n, v_row.n);
    END LOOP;
END
$$;

-- Enqueues jobs into a batch, in one call: into a new batch when p_batch is
-- NULL (with its description and callbacks: p_cb_* hold one callback per
-- element, the arguments of pgfifo.enqueue for one job, and p_cb_event its
-- event), into the open batch p_batch otherwise. The jobs are given as
-- pgfifo.enqueue takes them, without unique keys (a batch's jobs are its
-- own). A new batch is closed at once unless p_keep_open; a batch closed
-- with every job already ended (or with none) completes now. Returns the
-- batch's id and the jobs' ids in input order. Raises, writing nothing, for
-- a missing batch (pgfifo_batch_missing), a closed one
-- (pgfifo_batch_closed), an unknown or repeated event, callbacks given for
-- an existing batch, or arrays of different lengths.
CREATE OR REPLACE FUNCTION pgfifo.batch_enqueue(
    p_batch           bigint,
    p_description     text,
    p_keep_open       boolean,
    p_cb_event        text[],
    p_cb_queue        text[],
    p_cb_group        text[],
    p_cb_kind         text[],
    p_cb_payload      jsonb[],
    p_cb_priority     smallint[],
    p_cb_max_attempts integer[],
    p_queue           text[],
    p_group           text[],
    p_kind            text[],
    p_payload         jsonb[],
    p_priority        smallint[],
    p_max_attempts    integer[],
    p_run_at_us       bigint[],
    p_delay_us        bigint[],
    OUT batch_id      bigint,
    OUT job_ids       bigint[]
)
LANGUAGE plpgsql
AS $$
DECLARE
    v_n       integer := coalesce(cardinality(p_queue), 0);
    v_cbs     integer := coalesce(cardinality(p_cb_event), 0);
    v_closed  timestamptz;
    v_close   boolean;
BEGIN
    /*@dist PERFORM pgfifo.not_distributed('batches'); */
    PERFORM pgfifo.require_read_committed('batch');
    IF v_n <> coalesce(cardinality(p_group), 0) OR v_n <> coalesce(cardinality(p_kind), 0)
       OR v_n <> coalesce(cardinality(p_payload), 0) OR v_n <> coalesce(cardinality(p_priority), 0)
       OR v_n <> coalesce(cardinality(p_max_attempts), 0)
       OR v_n <> coalesce(cardinality(p_run_at_us), 0) OR v_n <> coalesce(cardinality(p_delay_us), 0)
       OR v_cbs <> coalesce(cardinality(p_cb_queue), 0) OR v_cbs <> coalesce(cardinality(p_cb_group), 0)
       OR v_cbs <> coalesce(cardinality(p_cb_kind), 0) OR v_cbs <> coalesce(cardinality(p_cb_payload), 0)
       OR v_cbs <> coalesce(cardinality(p_cb_priority), 0)
       OR v_cbs <> coalesce(cardinality(p_cb_max_attempts), 0) THEN
        RAISE EXCEPTION 'pgfifo batch: the arrays of jobs and of callbacks must each have one length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_cbs > 0 THEN
        IF p_batch IS NOT NULL THEN
            RAISE EXCEPTION 'pgfifo batch: callbacks are given when a batch is created, not to batch %', p_batch
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF NOT p_cb_event <@ ARRAY['success', 'complete', 'failure']
           OR (SELECT count(DISTINCT e) FROM unnest(p_cb_event) AS e) <> v_cbs THEN
            RAISE EXCEPTION 'pgfifo batch: callback events must be success, complete or failure, each at most once (got %)', p_cb_event
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    -- The jobs first, the batch's rows last (see the lock order above).
    job_ids := pgfifo.enqueue(p_queue, p_group, p_kind, p_payload, p_priority, p_max_attempts,
                              NULL, p_run_at_us, p_delay_us);
    IF p_batch IS NULL THEN
        v_close := NOT coalesce(p_keep_open, false);
        INSERT INTO pgfifo.batch (description, closed_at)
        VALUES (p_description, CASE WHEN v_close THEN now() END)
        RETURNING id INTO batch_id;
        INSERT INTO pgfifo.batch_callback
            (batch_id, event, queue, group_id, kind, payload, priority, max_attempts)
        SELECT batch_id, t.event, t.queue, t.grp, t.kind, t.payload, t.priority, t.max_attempts
        FROM unnest(p_cb_event, p_cb_queue, p_cb_group, p_cb_kind, p_cb_payload, p_cb_priority,
                    p_cb_max_attempts) AS t(event, queue, grp, kind, payload, priority, max_attempts);
        PERFORM pgfifo.batch_count_jobs(batch_id, cardinality(job_ids), 0);
    ELSE
        batch_id := p_batch;
        v_closed := pgfifo.batch_count_jobs(p_batch, cardinality(job_ids), 0);
        IF v_closed IS NOT NULL THEN
            RAISE EXCEPTION 'pgfifo batch: batch % is closed (since %): no job can be added', p_batch, v_closed
                USING ERRCODE = 'object_not_in_prerequisite_state', CONSTRAINT = 'pgfifo_batch_closed',
                      DETAIL = p_batch::text;
        END IF;
        v_close := false;
    END IF;
    INSERT INTO pgfifo.batch_job (job_id, batch_id)
    SELECT j, batch_id FROM unnest(job_ids) AS j;
    IF v_close THEN
        -- No job can have ended yet: only an empty batch completes here.
        PERFORM pgfifo.batch_settle(batch_id);
    END IF;
END
$$;

-- Closes the open batch p_batch: no job can be added any more, and it
-- completes when every job has ended (at once if they all have). Returns
-- false when it was closed already (nothing changes). Raises
-- pgfifo_batch_missing for an unknown id.
CREATE OR REPLACE FUNCTION pgfifo.batch_close(p_batch bigint) RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pgfifo.require_read_committed('batch close');
    UPDATE pgfifo.batch SET closed_at = now() WHERE id = p_batch AND closed_at IS NULL;
    IF FOUND THEN
        PERFORM pgfifo.batch_settle(p_batch);
        RETURN true;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pgfifo.batch AS b WHERE b.id = p_batch) THEN
        RAISE EXCEPTION 'pgfifo batch: no batch has id %', p_batch
            USING ERRCODE = 'no_data_found', CONSTRAINT = 'pgfifo_batch_missing',
                  DETAIL = p_batch::text;
    END IF;
    RETURN false;
END
$$;

-- Deletes up to p_limit batches that retention has emptied: completed, and
-- neither any of their jobs nor any job their callbacks enqueued is left
-- (retention purged them; a failed job kept for an operator keeps its
-- batch, whose counts its retry still corrects). Their shards, members and
-- callbacks go with them. Returns how many. Called by retention.
CREATE OR REPLACE FUNCTION pgfifo.clean_batches(p_limit integer) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_n bigint := 0;
BEGIN
    -- (Batches are not on the distributed layout yet: opening one refuses
    -- there, so there is nothing to clean.)
    /*@dist RETURN 0; */
    IF to_regclass('pgfifo.batch') IS NULL THEN
        RETURN 0;
    END IF;
    WITH victims AS (
        SELECT b.id FROM pgfifo.batch AS b
        WHERE b.completed_at IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM pgfifo.batch_job AS m
                          JOIN pgfifo.job AS j ON j.id = m.job_id
                          WHERE m.batch_id = b.id)
          AND NOT EXISTS (SELECT 1 FROM pgfifo.batch_callback AS c
                          JOIN pgfifo.job AS j ON j.id = c.job_id
                          WHERE c.batch_id = b.id)
        ORDER BY b.id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED),
    gone AS (
        DELETE FROM pgfifo.batch AS b USING victims AS v
        WHERE b.id = v.id
        RETURNING 1)
    SELECT count(*) INTO v_n FROM gone;
    RETURN v_n;
END
$$;

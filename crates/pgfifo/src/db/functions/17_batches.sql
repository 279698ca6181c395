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
-- Locking contract. A batch's row is locked (UPDATE) by every transaction
-- that changes its counters: one UPDATE per batch per call, in batch id
-- order, held until that transaction commits, which follows at once for a
-- runner's completion. The events are decided and the callbacks enqueued
-- under that lock, so two transactions that end a batch's last jobs at the
-- same moment are serialized by the row: the second one sees the first
-- one's counts and callback ids (READ COMMITTED: each statement sees what
-- committed before it), and a callback is enqueued once. A transaction
-- that rolls back (a crash, a lost connection) takes its counts and its
-- callbacks with it.
--
-- Lock order. A completion takes the batch's row after its jobs' rows and
-- before it moves its groups' heads (advance_head takes a group's
-- exclusive advisory lock, without waiting): a callback's enqueue, which
-- waits for that advisory lock shared, never waits for a transaction
-- that waits for the batch's row. Adding jobs enqueues them first and
-- locks the batch's row last, for the same reason.

-- Fires the events that p_batch's counters decide and that have not fired:
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
BEGIN
    SELECT b.closed_at, b.completed_at, b.total, b.succeeded, b.failed, b.cancelled
    INTO v_b FROM pgfifo.batch AS b WHERE b.id = p_batch;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_b.failed > 0 THEN
        v_events := v_events || 'failure'::text;
    END IF;
    IF v_b.closed_at IS NOT NULL AND v_b.succeeded + v_b.failed + v_b.cancelled = v_b.total THEN
        v_events := v_events || 'complete'::text;
        IF v_b.completed_at IS NULL THEN
            UPDATE pgfifo.batch SET completed_at = clock_timestamp() WHERE id = p_batch;
        END IF;
    END IF;
    IF v_b.closed_at IS NOT NULL AND v_b.succeeded = v_b.total THEN
        v_events := v_events || 'success'::text;
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
END
$$;

-- Counts the terminal outcomes among p_outcomes ('succeeded', 'failed',
-- 'cancelled'; others are ignored) of the jobs p_ids that belong to a
-- batch, once per batch, and fires the events they decide. Called by the
-- functions that write outcomes, in their transaction, with the jobs'
-- rows held. Each job must be counted once per terminal outcome it
-- reaches: callers pass a job only when it leaves 'queued' (or running)
-- for good.
CREATE OR REPLACE FUNCTION pgfifo.batch_outcomes(p_ids bigint[], p_outcomes text[]) RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_row record;
    v_due boolean;
    v_now timestamptz := clock_timestamp();
BEGIN
    FOR v_row IN
        SELECT m.batch_id,
               count(*) FILTER (WHERE t.outcome = 'succeeded') AS s,
               count(*) FILTER (WHERE t.outcome = 'failed') AS f,
               count(*) FILTER (WHERE t.outcome = 'cancelled') AS c
        FROM unnest(p_ids, p_outcomes) AS t(id, outcome)
        JOIN pgfifo.batch_job AS m ON m.job_id = t.id
        WHERE t.outcome IN ('succeeded', 'failed', 'cancelled')
        GROUP BY m.batch_id
        ORDER BY m.batch_id
    LOOP
        -- Whether an event may fire: checked on the updated row, so most
        -- calls (a batch not done, no new failure) end here.
        UPDATE pgfifo.batch AS b
        SET succeeded = b.succeeded + v_row.s,
            failed = b.failed + v_row.f,
            cancelled = b.cancelled + v_row.c,
            first_failed_at = CASE WHEN v_row.f > 0 THEN coalesce(b.first_failed_at, v_now)
                                   ELSE b.first_failed_at END
        WHERE b.id = v_row.batch_id
        RETURNING v_row.f > 0
                  OR (b.closed_at IS NOT NULL AND b.succeeded + b.failed + b.cancelled = b.total)
        INTO v_due;
        IF v_due THEN
            PERFORM pgfifo.batch_settle(v_row.batch_id);
        END IF;
    END LOOP;
END
$$;

-- Failed jobs p_ids that an operator put back in their queues (retry_jobs)
-- no longer count as failed in their batches: they count again when they
-- end. Callbacks that fired stay fired; a 'success' that has not fired may
-- still fire when the retried jobs succeed.
CREATE OR REPLACE FUNCTION pgfifo.batch_retried(p_ids bigint[]) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_row record;
BEGIN
    FOR v_row IN
        SELECT m.batch_id, count(*) AS n FROM pgfifo.batch_job AS m
        WHERE m.job_id = ANY (p_ids)
        GROUP BY m.batch_id ORDER BY m.batch_id
    LOOP
        UPDATE pgfifo.batch SET failed = failed - v_row.n WHERE id = v_row.batch_id;
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
    -- The jobs first, the batch's row last (see the lock order above).
    job_ids := pgfifo.enqueue(p_queue, p_group, p_kind, p_payload, p_priority, p_max_attempts,
                              NULL, p_run_at_us, p_delay_us);
    IF p_batch IS NULL THEN
        v_close := NOT coalesce(p_keep_open, false);
        INSERT INTO pgfifo.batch (description, total, closed_at)
        VALUES (p_description, v_n, CASE WHEN v_close THEN now() END)
        RETURNING id INTO batch_id;
        INSERT INTO pgfifo.batch_callback
            (batch_id, event, queue, group_id, kind, payload, priority, max_attempts)
        SELECT batch_id, t.event, t.queue, t.grp, t.kind, t.payload, t.priority, t.max_attempts
        FROM unnest(p_cb_event, p_cb_queue, p_cb_group, p_cb_kind, p_cb_payload, p_cb_priority,
                    p_cb_max_attempts) AS t(event, queue, grp, kind, payload, priority, max_attempts);
    ELSE
        UPDATE pgfifo.batch AS b SET total = b.total + v_n
        WHERE b.id = p_batch AND b.closed_at IS NULL
        RETURNING b.id INTO batch_id;
        IF NOT FOUND THEN
            SELECT b.closed_at INTO v_closed FROM pgfifo.batch AS b WHERE b.id = p_batch;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'pgfifo batch: no batch has id %', p_batch
                    USING ERRCODE = 'no_data_found', CONSTRAINT = 'pgfifo_batch_missing',
                          DETAIL = p_batch::text;
            END IF;
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

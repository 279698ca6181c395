-- Enqueue: one call for any number of jobs.
--
-- Installed whole by `migrate` (CREATE OR REPLACE) after the numbered
-- migrations; see crates/pgfifo/src/migrate.rs and docs/upgrading.md for
-- how a change of arguments or result type is made.

-- Enqueues a batch of jobs in one call; returns one id per input row, in input
-- order (for a row whose unique key is taken, the id of the unfinished job that
-- holds it), as one array: a row per id costs more than the insert of a small
-- job, on the server and in the client.
--
-- Locking contract. The enqueuer takes the shared advisory lock of every group
-- it writes to (striped, see group_lock_key) and keeps it until its
-- transaction ends. For a group that is missing or idle (no head) it
-- appends a row to pgfifo.group_wake, and a runner makes the group active
-- after this transaction commits (promote). A single job enqueued alone in
-- its transaction may make an idle group active itself, when it can lock
-- the group's row without waiting (below); it holds that row only until
-- its commit, which follows at once. A group that is active (or held by a
-- failed head) needs nothing: its runner finds the new job when it advances
-- the head, or the release of the hold does. The one race, a group
-- declared idle while this transaction is open, is closed by the advisory
-- lock: a group becomes idle only in advance_head, which declares it idle
-- only if it can take the lock exclusively (so no enqueuer is in flight),
-- or it did so first, and the statement below that looks for active groups
-- sees the group idle.
--
-- Enqueue waits for nothing but that exclusive lock, held by a runner for the
-- moment between declaring a group idle and committing (group rows are
-- locked SKIP LOCKED). Needs READ COMMITTED:
-- each statement must see commits that happened while it waited.
CREATE OR REPLACE FUNCTION pgfifo.enqueue(
    p_queue        text[],
    p_group        text[],
    p_kind         text[],
    p_payload      jsonb[],
    p_priority     smallint[],
    p_max_attempts integer[],
    p_unique_key   text[],
    p_run_at_us    bigint[],
    p_delay_us     bigint[]
) RETURNS bigint[]
LANGUAGE plpgsql
AS $$
DECLARE
    v_n       integer := cardinality(p_queue);
    v_ids     bigint[];
    v_out     bigint[];
    v_created boolean[];
    v_i       integer;
    v_id      bigint;
    v_tries   integer;
    v_notify  text[];
    v_gq      text[];
    v_gg      text[];
    v_void    text;
    v_at      timestamptz;
    v_active  boolean;
    v_wide    boolean;
    v_alone   boolean;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pgfifo enqueue requires READ COMMITTED isolation (found %)',
            current_setting('transaction_isolation')
            USING ERRCODE = 'invalid_transaction_state', CONSTRAINT = 'pgfifo_read_committed',
                  DETAIL = current_setting('transaction_isolation');
    END IF;
    -- Whether this statement is its transaction's only one (see below). The
    -- caller says so for this call alone: in a transaction that a BEGIN
    -- diesel did not see opened, a later enqueue must not take it as said.
    v_alone := coalesce(current_setting('pgfifo.enqueue_alone', true), '') = 'on';
    IF v_alone THEN
        v_void := set_config('pgfifo.enqueue_alone', '', true);
    END IF;
    IF v_n IS NULL OR v_n = 0 THEN
        RETURN '{}';
    END IF;

    -- One job without a unique key, the common call: the same steps as
    -- below, written for one row (the job; the group's row; the wake row,
    -- when the group is not active). Lock, id and notifications are
    -- assignments of plain expressions, which PL/pgSQL evaluates without
    -- starting a query (PERFORM would start one; the functions return void,
    -- hence the casts). Less than half the server's time of the batch path
    -- for one job.
    IF v_n = 1 AND p_unique_key[1] IS NULL THEN
        IF p_group[1] IS NOT NULL THEN
            v_void := pg_advisory_xact_lock_shared(
                1885824614, pgfifo.group_lock_key(p_queue[1], p_group[1]))::text;
        END IF;
        v_id := nextval('pgfifo.job_id_seq');
        v_at := pgfifo.run_after(p_run_at_us[1], p_delay_us[1]);
        INSERT INTO pgfifo.job (id, queue, group_id, kind, payload, priority, max_attempts, run_after
                                /*@dist , part */)
        VALUES (v_id, p_queue[1], p_group[1], p_kind[1], p_payload[1], p_priority[1],
                p_max_attempts[1], v_at /*@dist , pgfifo.job_part(p_queue[1], p_group[1], v_id) */);
        IF p_group[1] IS NULL THEN
            v_void := pg_notify('pgfifo', p_queue[1])::text;
            RETURN ARRAY[v_id];
        END IF;
        -- The group's row, read once: it cannot become idle under the
        -- advisory lock this holds (see above). An active group needs
        -- nothing, unless its concurrency may be above 1 (its own setting
        -- or its queue's default): then the new job may start at once in a
        -- free slot beside its running ones, and runners are told, as a
        -- poll would find it. (At concurrency 1 the next job waits for the
        -- head, and the runner finds it when the head completes.)
        -- (In one statement with the group's row; in a branch, so that a
        -- schema without group controls never plans it. Distributed: the
        -- limits, a table of the coordinator, are read apart.)
        IF to_regclass('pgfifo.group_control') IS NOT NULL THEN
            /*@plain*/
            SELECT g.ready_at IS NOT NULL,
                   EXISTS (SELECT 1 FROM pgfifo.group_control AS c
                           WHERE c.queue = g.queue AND c.group_id IN ('', g.group_id)
                             AND c.concurrency > 1)
            INTO v_active, v_wide FROM pgfifo.queue_group AS g
            WHERE g.queue = p_queue[1] AND g.group_id = p_group[1];
            /*@end*/
            /*@dist
            SELECT g.ready_at IS NOT NULL INTO v_active FROM pgfifo.queue_group AS g
            WHERE g.queue = p_queue[1] AND g.group_id = p_group[1]
              AND g.part = pgfifo.part_of(p_queue[1], p_group[1]);
            v_wide := EXISTS (SELECT 1 FROM pgfifo.group_control AS c
                              WHERE c.queue = p_queue[1] AND c.group_id IN ('', p_group[1])
                                AND c.concurrency > 1);
            */
        ELSE
            SELECT g.ready_at IS NOT NULL INTO v_active FROM pgfifo.queue_group AS g
            WHERE g.queue = p_queue[1] AND g.group_id = p_group[1]
              /*@dist AND g.part = pgfifo.part_of(p_queue[1], p_group[1]) */;
        END IF;
        IF v_active THEN
            IF v_wide THEN
                v_void := pg_notify('pgfifo', p_queue[1])::text;
            END IF;
            RETURN ARRAY[v_id];
        END IF;
        -- An idle group (no head) of a queue without group controls, whose
        -- row nobody holds, becomes active here: what promote would do,
        -- without its transaction, round trip and call per job. Its head is
        -- the group's oldest queued job, as promote would set it (another
        -- enqueuer's job may have found the row locked, by promote, say,
        -- and be waiting for a promote): if that one is due now. The row
        -- stays locked until this transaction ends: picks pass it by (SKIP
        -- LOCKED) until the job is visible, and another enqueuer of the
        -- group, finding it locked, leaves a wake row instead of waiting.
        -- So only an enqueue that is its transaction's only statement does
        -- it (the caller says so: pgfifo.enqueue_alone, set by pgfifo's
        -- enqueue outside a transaction): in a transaction that goes on,
        -- the lock would hold back other producers' committed jobs of the
        -- group for as long as it lasts.
        -- Everything else leaves a wake row: an enqueue inside a longer
        -- transaction, a missing group row (its insert could wait for
        -- another enqueuer's), a head not due yet (its time reaches the
        -- runner through promote), a paused group, a held one, group
        -- controls, and a schema without them (reverted under these
        -- functions); and every enqueue in the distributed layout, where
        -- the lock would be taken by a statement on a worker through the
        -- coordinator (a wake row costs the same there).
        IF v_active IS NOT NULL AND v_at <= clock_timestamp()
           AND v_alone
           AND to_regclass('pgfifo.group_control') IS NOT NULL /*@dist AND false */ THEN
            UPDATE pgfifo.queue_group AS g
            SET head_id = n.id, priority = n.priority, ready_at = n.run_after, idle_since = NULL
            FROM (SELECT j.id, j.priority, j.run_after FROM pgfifo.job AS j
                  WHERE j.queue = p_queue[1] AND j.group_id = p_group[1] AND j.state = 'queued'
                  ORDER BY j.id LIMIT 1) AS n
            WHERE g.ctid = (SELECT i.ctid FROM pgfifo.queue_group AS i
                            WHERE i.queue = p_queue[1] AND i.group_id = p_group[1]
                              AND i.head_id IS NULL AND i.ready_at IS NULL
                            FOR NO KEY UPDATE SKIP LOCKED)
              AND n.run_after <= clock_timestamp()
              AND NOT EXISTS (SELECT 1 FROM pgfifo.group_pause AS p
                              WHERE p.queue = p_queue[1] AND p.group_id = p_group[1])
              AND NOT EXISTS (SELECT 1 FROM pgfifo.group_control AS c
                              WHERE c.queue = p_queue[1]);
            IF FOUND THEN
                v_void := pg_notify('pgfifo', p_queue[1])::text;
                RETURN ARRAY[v_id];
            END IF;
        END IF;
        INSERT INTO pgfifo.group_wake (queue, group_id /*@dist , part */)
        VALUES (p_queue[1], p_group[1] /*@dist , pgfifo.part_of(p_queue[1], p_group[1]) */);
        v_void := pg_notify('pgfifo_groups', p_queue[1])::text;
        RETURN ARRAY[v_id];
    END IF;

    -- The batch's groups, once: the locks and the wake rows need them.
    SELECT array_agg(d.q), array_agg(d.g) INTO v_gq, v_gg
    FROM (SELECT DISTINCT t.q, t.g FROM unnest(p_queue, p_group) AS t(q, g)
          WHERE t.g IS NOT NULL) AS d;
    PERFORM pg_advisory_xact_lock_shared(1885824614, s.k)
    FROM (SELECT DISTINCT pgfifo.group_lock_key(t.q, t.g) AS k
          FROM unnest(v_gq, v_gg) AS t(q, g) ORDER BY 1) AS s;

    -- Ids are taken in one ascending run so that input order is id order.
    v_ids := ARRAY(SELECT nextval('pgfifo.job_id_seq') FROM generate_series(1, v_n) ORDER BY 1);

    IF p_unique_key IS NULL OR cardinality(array_remove(p_unique_key, NULL)) = 0 THEN
        -- Fast path: no unique keys.
        INSERT INTO pgfifo.job (id, queue, group_id, kind, payload, priority, max_attempts, run_after
                                /*@dist , part */)
        SELECT t.id, t.q, t.g, t.k, t.p, t.pr, t.ma, pgfifo.run_after(t.at, t.dl)
               /*@dist , pgfifo.job_part(t.q, t.g, t.id) */
        FROM unnest(v_ids, p_queue, p_group, p_kind, p_payload, p_priority, p_max_attempts,
                    p_run_at_us, p_delay_us) AS t(id, q, g, k, p, pr, ma, at, dl);
        v_out := v_ids;
        v_created := array_fill(true, ARRAY[v_n]);
    ELSE
        v_out := v_ids;
        v_created := array_fill(false, ARRAY[v_n]);
        FOR v_i IN 1 .. v_n LOOP
            v_tries := 0;
            LOOP
                INSERT INTO pgfifo.job (id, queue, group_id, kind, payload, priority, max_attempts,
                                        run_after, unique_key /*@dist , part */)
                VALUES (v_ids[v_i], p_queue[v_i], p_group[v_i], p_kind[v_i], p_payload[v_i],
                        p_priority[v_i], p_max_attempts[v_i],
                        pgfifo.run_after(p_run_at_us[v_i], p_delay_us[v_i]), p_unique_key[v_i]
                        /*@dist , pgfifo.job_part(p_queue[v_i], p_group[v_i], v_ids[v_i],
                                                  p_unique_key[v_i]) */)
                ON CONFLICT (/*@dist part, */ queue, unique_key)
                WHERE unique_key IS NOT NULL AND state = 'queued'
                DO NOTHING
                RETURNING id INTO v_id;
                IF v_id IS NOT NULL THEN
                    v_created[v_i] := true;
                    EXIT;
                END IF;
                SELECT id INTO v_id FROM pgfifo.job
                WHERE queue = p_queue[v_i] AND unique_key = p_unique_key[v_i] AND state = 'queued'
                  /*@dist AND part = pgfifo.job_part(p_queue[v_i], p_group[v_i], v_ids[v_i],
                                                     p_unique_key[v_i]) */;
                IF v_id IS NOT NULL THEN
                    v_out[v_i] := v_id;
                    EXIT;
                END IF;
                -- The holder of the key finished between the two statements: try again.
                v_tries := v_tries + 1;
                IF v_tries > 10 THEN
                    RAISE EXCEPTION 'pgfifo enqueue: unique key % keeps changing hands', p_unique_key[v_i]
                        USING ERRCODE = 'lock_not_available', CONSTRAINT = 'pgfifo_unique_key_busy';
                END IF;
            END LOOP;
        END LOOP;
    END IF;

    -- Groups that are missing or idle must be made active once this commits
    -- (with unique keys, only those that got a new job).
    IF array_position(v_created, false) IS NOT NULL THEN
        SELECT array_agg(d.q), array_agg(d.g) INTO v_gq, v_gg
        FROM (SELECT DISTINCT t.q, t.g FROM unnest(p_queue, p_group, v_created) AS t(q, g, created)
              WHERE t.g IS NOT NULL AND t.created) AS d;
    END IF;
    /*@plain*/
    WITH woken AS (
        INSERT INTO pgfifo.group_wake (queue, group_id)
        SELECT d.q, d.g
        FROM unnest(v_gq, v_gg) AS d(q, g)
        WHERE NOT EXISTS (SELECT 1 FROM pgfifo.queue_group AS qg
                          WHERE qg.queue = d.q AND qg.group_id = d.g AND qg.ready_at IS NOT NULL)
        RETURNING queue)
    SELECT array_agg(DISTINCT queue) INTO v_notify FROM woken;
    /*@end*/
    -- In the distributed layout the active groups are read first, apart
    -- (a subquery correlated with the wake rows cannot be routed).
    /*@dist
    WITH woken AS (
        INSERT INTO pgfifo.group_wake (queue, group_id, part)
        SELECT d.q, d.g, pgfifo.part_of(d.q, d.g)
        FROM unnest(v_gq, v_gg) AS d(q, g)
        WHERE (d.q, d.g) NOT IN (SELECT qg.queue, qg.group_id FROM pgfifo.queue_group AS qg
                                 WHERE qg.part = ANY (ARRAY(SELECT pgfifo.part_of(x.q, x.g)
                                                            FROM unnest(v_gq, v_gg) AS x(q, g)))
                                   AND qg.ready_at IS NOT NULL)
        RETURNING queue)
    SELECT array_agg(DISTINCT queue) INTO v_notify FROM woken;
    */

    -- Wake runners at commit, once per queue that has a woken group (they
    -- promote it, and wake a lane per group promoted) or a new ungrouped job
    -- (they wake a lane). Active groups need no wake-up: their runner
    -- advances.
    PERFORM pg_notify('pgfifo_groups', q) FROM unnest(v_notify) AS q;
    -- And once per queue with a group whose concurrency may be above 1, as
    -- in the one-job path above: an active one may start a new job beside
    -- its running ones.
    IF to_regclass('pgfifo.group_control') IS NOT NULL THEN
        PERFORM pg_notify('pgfifo', s.q)
        FROM (SELECT DISTINCT t.q FROM unnest(v_gq, v_gg) AS t(q, g)
              JOIN pgfifo.group_control AS c
                ON c.queue = t.q AND c.group_id IN ('', t.g) AND c.concurrency > 1) AS s(q);
    END IF;
    IF p_group IS NULL OR array_position(p_group, NULL::text) IS NOT NULL THEN
        PERFORM pg_notify('pgfifo', s.q)
        FROM (SELECT DISTINCT t.q FROM unnest(p_queue, p_group, v_created) AS t(q, g, created)
              WHERE t.g IS NULL AND t.created) AS s(q);
    END IF;

    RETURN v_out;
END
$$;

-- The same, for jobs that carry the W3C trace context of their enqueue
-- (docs/tracing.md): p_traceparent and p_tracestate hold one element per
-- job (NULL: none for that job). It enqueues through the function above,
-- with the same locking contract and the same result, and then keeps each
-- new job's context in pgfifo.job_trace. A row whose unique key was taken
-- gets no context: its id is the job that holds the key, which keeps what
-- its own enqueue carried. (A holder that commits between the look-up
-- below and the insert above is not told apart from a new job: if it has
-- no context, it gets this one.)
--
-- An overload rather than new arguments of the function above: released
-- runners and producers call that one with nine arguments, and a job
-- without a context costs nothing more there. After `migrate down` past
-- 0009_trace_context the table is gone: the jobs are enqueued all the
-- same, without their contexts.
CREATE OR REPLACE FUNCTION pgfifo.enqueue(
    p_queue        text[],
    p_group        text[],
    p_kind         text[],
    p_payload      jsonb[],
    p_priority     smallint[],
    p_max_attempts integer[],
    p_unique_key   text[],
    p_run_at_us    bigint[],
    p_delay_us     bigint[],
    p_traceparent  text[],
    p_tracestate   text[]
) RETURNS bigint[]
LANGUAGE plpgsql
AS $$
DECLARE
    v_ids   bigint[];
    v_taken bigint[];
BEGIN
    IF cardinality(p_traceparent) IS DISTINCT FROM cardinality(p_queue)
       OR (p_tracestate IS NOT NULL
           AND cardinality(p_tracestate) IS DISTINCT FROM cardinality(p_queue)) THEN
        RAISE EXCEPTION 'pgfifo enqueue: % jobs but % traceparents and % tracestates',
            coalesce(cardinality(p_queue), 0), coalesce(cardinality(p_traceparent), 0),
            coalesce(cardinality(p_tracestate), 0)
            USING ERRCODE = 'invalid_parameter_value', CONSTRAINT = 'pgfifo_trace_context';
    END IF;
    IF to_regclass('pgfifo.job_trace') IS NULL
       OR array_position(p_traceparent, NULL::text) IS NOT NULL
          AND cardinality(array_remove(p_traceparent, NULL)) = 0 THEN
        RETURN pgfifo.enqueue(p_queue, p_group, p_kind, p_payload, p_priority, p_max_attempts,
                              p_unique_key, p_run_at_us, p_delay_us);
    END IF;
    -- The jobs that hold the unique keys asked for, before the enqueue
    -- returns their ids as the ids of those rows.
    IF p_unique_key IS NOT NULL THEN
        v_taken := ARRAY(
            SELECT j.id FROM unnest(p_queue, p_unique_key /*@dist , p_group */) AS t(q, k /*@dist , g */)
            JOIN pgfifo.job AS j ON j.queue = t.q AND j.unique_key = t.k AND j.state = 'queued'
                                 /*@dist AND j.part = pgfifo.job_part(t.q, t.g, 0, t.k) */
            WHERE t.k IS NOT NULL);
    END IF;
    v_ids := pgfifo.enqueue(p_queue, p_group, p_kind, p_payload, p_priority, p_max_attempts,
                            p_unique_key, p_run_at_us, p_delay_us);
    INSERT INTO pgfifo.job_trace (job_id, traceparent, tracestate /*@dist , part */)
    SELECT t.id, t.tp, nullif(t.ts, '')
           /*@dist , pgfifo.job_part(t.q, t.g, t.id, t.k) */
    FROM unnest(v_ids, p_traceparent, coalesce(p_tracestate, p_traceparent[0:0])
                /*@dist , p_queue, p_group, p_unique_key */) AS t(id, tp, ts /*@dist , q, g, k */)
    WHERE t.tp IS NOT NULL AND (v_taken IS NULL OR t.id <> ALL (v_taken))
    ON CONFLICT (/*@dist part, */ job_id) DO NOTHING;
    RETURN v_ids;
END
$$;

-- pgfifo schema, version 1.
--
-- Everything lives in the `pgfifo` schema (created by the migration runner,
-- which also keeps its own bookkeeping table `pgfifo.schema_migrations`).
-- docs/locking.md explains the design; the comments here state the contracts.

-- Job ids come from one sequence: order inside a group is id order, never a
-- timestamp (a batch insert gives every row the same now()).
CREATE SEQUENCE pgfifo.job_id_seq AS bigint;

CREATE TABLE pgfifo.job (
    id           bigint      PRIMARY KEY DEFAULT nextval('pgfifo.job_id_seq'),
    queue        text        NOT NULL CHECK (octet_length(queue) BETWEEN 1 AND 128),
    -- NULL: an ungrouped job, serialized with nothing.
    group_id     text        CHECK (octet_length(group_id) BETWEEN 1 AND 256),
    kind         text        NOT NULL CHECK (octet_length(kind) BETWEEN 1 AND 256),
    payload      jsonb       NOT NULL,
    -- queued: waiting, running (its row is locked by a runner) or waiting for
    -- a retry (attempts > 0, run_after in the future). The others are final.
    state        text        NOT NULL DEFAULT 'queued'
                             CHECK (state IN ('queued', 'succeeded', 'failed', 'cancelled')),
    priority     smallint    NOT NULL DEFAULT 0,
    max_attempts integer     NOT NULL CHECK (max_attempts >= 1),
    -- Attempts whose outcome was written. Attempts interrupted by a crash are
    -- only in pgfifo.job_attempt, which is the authority at pick time.
    attempts     integer     NOT NULL DEFAULT 0,
    run_after    timestamptz NOT NULL DEFAULT now(),
    unique_key   text,
    result       jsonb,
    last_error   text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz
);
ALTER SEQUENCE pgfifo.job_id_seq OWNED BY pgfifo.job.id;

-- The next head of a group: the oldest queued job (advance_head).
CREATE INDEX job_group_queued_idx ON pgfifo.job (queue, group_id, id)
    WHERE state = 'queued' AND group_id IS NOT NULL;

-- The pick of ungrouped jobs (a plain SKIP LOCKED queue).
CREATE INDEX job_ungrouped_queued_idx ON pgfifo.job (queue, priority DESC, run_after, id)
    WHERE state = 'queued' AND group_id IS NULL;

-- At most one unfinished job per (queue, unique_key).
CREATE UNIQUE INDEX job_unique_key_idx ON pgfifo.job (queue, unique_key)
    WHERE unique_key IS NOT NULL AND state = 'queued';

-- One row per (queue, group) that has ever had a job.
--
-- The row is the group's mutex: a runner holds FOR UPDATE on it for the whole
-- run of the group's head job. It also carries the group's head, so a pick
-- finds a free group and its head by one index lookup whatever the backlog:
--   head_id  = the oldest unfinished job of the group, NULL when idle
--   priority = the head's priority, ready_at = the head's run_after
-- Only two parties write head_id: the runner holding the row lock (advance on
-- completion) and an enqueuer that finds the group idle (head_id IS NULL). The
-- advisory lock of the group orders the two (see enqueue and advance_head).
CREATE TABLE pgfifo.queue_group (
    queue      text        NOT NULL,
    group_id   text        NOT NULL,
    head_id    bigint,
    priority   smallint    NOT NULL DEFAULT 0,
    ready_at   timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, group_id)
);

-- The grouped pick: ready heads by priority, then age.
CREATE INDEX queue_group_ready_idx ON pgfifo.queue_group (queue, priority DESC, ready_at, head_id)
    WHERE head_id IS NOT NULL;

-- One row per started attempt, written in autocommit by the runner before the
-- handler starts, outside the job's transaction: attempts count even when the
-- process dies mid-run. No foreign key: the job row is locked FOR UPDATE by
-- the job's transaction while this row is written.
CREATE TABLE pgfifo.job_attempt (
    job_id      bigint      NOT NULL,
    attempt     integer     NOT NULL,
    runner      text        NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at timestamptz,
    error       text,
    PRIMARY KEY (job_id, attempt)
);

-- The advisory lock key of a group, in pgfifo's own two-key space (class
-- 0x70676666, "pgff") so it never meets the application's advisory locks. A
-- hash collision only makes two groups wait for each other a little.
CREATE FUNCTION pgfifo.group_lock_key(p_queue text, p_group text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN hashtext(p_queue || chr(31) || p_group);

-- When a new job may run: an absolute time (µs since the epoch), a delay from
-- the server's clock (µs), or now.
CREATE FUNCTION pgfifo.run_after(p_run_at_us bigint, p_delay_us bigint) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE
    WHEN p_run_at_us IS NOT NULL THEN to_timestamp(p_run_at_us / 1000000.0)
    WHEN p_delay_us IS NOT NULL THEN now() + p_delay_us * interval '1 microsecond'
    ELSE now()
END;

-- Enqueues a batch of jobs in one call; returns one id per input row, in input
-- order (for a row whose unique key is taken, the id of the unfinished job that
-- holds it).
--
-- Locking contract. The enqueuer takes the shared advisory lock of every group
-- it writes to and keeps it until its transaction ends. advance_head takes the
-- exclusive lock before it declares a group idle, so it either sees this
-- transaction's jobs (it waited for the commit) or ran first, in which case the
-- statements below see head_id IS NULL and make the first new job the head.
-- Enqueuers never wait for a running job: they only lock a queue_group row when
-- they create it or when it is idle (head_id IS NULL), and no runner holds an
-- idle group.
--
-- Needs READ COMMITTED: each statement below must see commits that happened
-- while it waited for a lock.
CREATE FUNCTION pgfifo.enqueue(
    p_queue        text[],
    p_group        text[],
    p_kind         text[],
    p_payload      jsonb[],
    p_priority     smallint[],
    p_max_attempts integer[],
    p_unique_key   text[],
    p_run_at_us    bigint[],
    p_delay_us     bigint[]
) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_n       integer := cardinality(p_queue);
    v_ids     bigint[];
    v_out     bigint[];
    v_created boolean[];
    v_i       integer;
    v_id      bigint;
    v_tries   integer;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pgfifo enqueue requires READ COMMITTED isolation (found %)',
            current_setting('transaction_isolation');
    END IF;
    IF v_n IS NULL OR v_n = 0 THEN
        RETURN;
    END IF;

    PERFORM pg_advisory_xact_lock_shared(1885824614, pgfifo.group_lock_key(q, g))
    FROM (SELECT DISTINCT q, g FROM unnest(p_queue, p_group) AS t(q, g)
          WHERE g IS NOT NULL ORDER BY 1, 2) AS s;

    -- Ids are taken in one ascending run so that input order is id order.
    v_ids := ARRAY(SELECT nextval('pgfifo.job_id_seq') FROM generate_series(1, v_n) ORDER BY 1);

    IF p_unique_key IS NULL OR cardinality(array_remove(p_unique_key, NULL)) = 0 THEN
        -- Fast path: no unique keys.
        INSERT INTO pgfifo.job (id, queue, group_id, kind, payload, priority, max_attempts, run_after)
        SELECT t.id, t.q, t.g, t.k, t.p, t.pr, t.ma, pgfifo.run_after(t.at, t.dl)
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
                                        run_after, unique_key)
                VALUES (v_ids[v_i], p_queue[v_i], p_group[v_i], p_kind[v_i], p_payload[v_i],
                        p_priority[v_i], p_max_attempts[v_i],
                        pgfifo.run_after(p_run_at_us[v_i], p_delay_us[v_i]), p_unique_key[v_i])
                ON CONFLICT (queue, unique_key) WHERE unique_key IS NOT NULL AND state = 'queued'
                DO NOTHING
                RETURNING id INTO v_id;
                IF v_id IS NOT NULL THEN
                    v_created[v_i] := true;
                    EXIT;
                END IF;
                SELECT id INTO v_id FROM pgfifo.job
                WHERE queue = p_queue[v_i] AND unique_key = p_unique_key[v_i] AND state = 'queued';
                IF v_id IS NOT NULL THEN
                    v_out[v_i] := v_id;
                    EXIT;
                END IF;
                -- The holder of the key finished between the two statements: try again.
                v_tries := v_tries + 1;
                IF v_tries > 10 THEN
                    RAISE EXCEPTION 'pgfifo enqueue: unique key % keeps changing hands', p_unique_key[v_i];
                END IF;
            END LOOP;
        END LOOP;
    END IF;

    -- Groups that gain their first unfinished job get it as head: new groups
    -- here, idle ones in the UPDATE. Sorted, so concurrent batches lock group
    -- rows in one order.
    INSERT INTO pgfifo.queue_group (queue, group_id, head_id, priority, ready_at)
    SELECT DISTINCT ON (t.q, t.g) t.q, t.g, t.id, t.pr, pgfifo.run_after(t.at, t.dl)
    FROM unnest(v_ids, p_queue, p_group, p_priority, p_run_at_us, p_delay_us, v_created)
         AS t(id, q, g, pr, at, dl, created)
    WHERE t.g IS NOT NULL AND t.created
    ORDER BY t.q, t.g, t.id
    ON CONFLICT (queue, group_id) DO NOTHING;

    UPDATE pgfifo.queue_group AS qg
    SET head_id = n.id, priority = n.pr, ready_at = n.ready_at
    FROM (SELECT DISTINCT ON (t.q, t.g) t.q, t.g, t.id, t.pr, pgfifo.run_after(t.at, t.dl) AS ready_at
          FROM unnest(v_ids, p_queue, p_group, p_priority, p_run_at_us, p_delay_us, v_created)
               AS t(id, q, g, pr, at, dl, created)
          WHERE t.g IS NOT NULL AND t.created
          ORDER BY t.q, t.g, t.id) AS n
    WHERE qg.queue = n.q AND qg.group_id = n.g AND qg.head_id IS NULL;

    -- Wake idle runners at commit, once per queue. Busy groups need no wake-up:
    -- their runner advances the head itself.
    PERFORM pg_notify('pgfifo', q)
    FROM (SELECT DISTINCT t.q FROM unnest(p_queue, v_created) AS t(q, created) WHERE t.created) AS s;

    RETURN QUERY SELECT unnest(v_out);
END
$$;

-- Makes the oldest queued job of a group (other than p_done, which the caller
-- is finishing) its head, or marks the group idle.
--
-- The caller holds the group's queue_group row FOR UPDATE. Before declaring
-- the group idle it takes the group's exclusive advisory lock, which waits for
-- enqueuers still inside their transactions, and looks again with a fresh
-- snapshot: a job committed by then is seen; an enqueuer that comes later
-- waits for this transaction and then finds head_id IS NULL.
CREATE FUNCTION pgfifo.advance_head(p_queue text, p_group text, p_done bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_next record;
BEGIN
    SELECT id, priority, run_after INTO v_next FROM pgfifo.job
    WHERE queue = p_queue AND group_id = p_group AND state = 'queued' AND id <> p_done
    ORDER BY id LIMIT 1;
    IF NOT FOUND THEN
        PERFORM pg_advisory_xact_lock(1885824614, pgfifo.group_lock_key(p_queue, p_group));
        SELECT id, priority, run_after INTO v_next FROM pgfifo.job
        WHERE queue = p_queue AND group_id = p_group AND state = 'queued' AND id <> p_done
        ORDER BY id LIMIT 1;
    END IF;
    UPDATE pgfifo.queue_group
    SET head_id = v_next.id, priority = coalesce(v_next.priority, 0), ready_at = v_next.run_after
    WHERE queue = p_queue AND group_id = p_group;
END
$$;

-- Picks one job to run and locks it. Called as the first statement of the
-- runner's job transaction T.
--
-- Locking contract: when a row is returned, T holds
--   * FOR UPDATE on the job's queue_group row (grouped jobs): no other runner
--     can pick any job of the group until T ends;
--   * FOR UPDATE on the job row;
-- until T commits (outcome written) or aborts (crash, lost connection,
-- shutdown): then the job is still the group's head and runs again.
--
-- The group row is locked first, SKIP LOCKED. Under READ COMMITTED, locking
-- re-reads the newest committed version of the row, so head_id is the head as
-- of the moment the lock was taken, even if the statement's snapshot is older.
-- The job row is then read and locked in a separate statement, whose snapshot
-- is taken after the group lock was acquired. Reading the head from the job
-- table in the same statement as the group lock would use a snapshot that can
-- predate the commit of the job that freed the group, and run it twice.
--
-- p_turn rotates the starting queue and alternates between grouped and
-- ungrouped jobs so neither starves.
CREATE FUNCTION pgfifo.pick(p_queues text[], p_turn integer)
RETURNS SETOF pgfifo.job
LANGUAGE plpgsql AS $$
DECLARE
    v_n     integer := cardinality(p_queues);
    v_q     text;
    v_group record;
    v_job   pgfifo.job;
    v_now   timestamptz := statement_timestamp();
BEGIN
    FOR v_i IN 0 .. coalesce(v_n, 0) - 1 LOOP
        v_q := p_queues[1 + (abs(p_turn) + v_i) % v_n];
        FOR v_kind IN 0 .. 1 LOOP
            IF (v_kind + p_turn) % 2 = 0 THEN
                SELECT queue, group_id, head_id INTO v_group FROM pgfifo.queue_group
                WHERE queue = v_q AND head_id IS NOT NULL AND ready_at <= v_now
                ORDER BY priority DESC, ready_at, head_id
                LIMIT 1
                FOR UPDATE SKIP LOCKED;
                IF FOUND THEN
                    SELECT * INTO v_job FROM pgfifo.job
                    WHERE id = v_group.head_id AND state = 'queued'
                    FOR UPDATE;
                    IF FOUND THEN
                        RETURN NEXT v_job;
                        RETURN;
                    END IF;
                    -- The head was finished or deleted out of band: repair the
                    -- pointer; the group is picked on a later call.
                    PERFORM pgfifo.advance_head(v_group.queue, v_group.group_id, v_group.head_id);
                END IF;
            ELSE
                SELECT * INTO v_job FROM pgfifo.job
                WHERE queue = v_q AND group_id IS NULL AND state = 'queued' AND run_after <= v_now
                ORDER BY priority DESC, run_after, id
                LIMIT 1
                FOR UPDATE SKIP LOCKED;
                IF FOUND THEN
                    RETURN NEXT v_job;
                    RETURN;
                END IF;
            END IF;
        END LOOP;
    END LOOP;
END
$$;

-- Records the start of an attempt for each job, in autocommit, outside the
-- jobs' transactions. Returns the attempt number of each job that still has
-- attempts left; a job missing from the result has used them all (earlier
-- attempts were interrupted) and must be marked failed. The caller holds each
-- job's locks, so no one else records attempts of these jobs concurrently.
CREATE FUNCTION pgfifo.start_attempts(p_ids bigint[], p_max integer[], p_runner text)
RETURNS TABLE (job_id bigint, attempt integer)
LANGUAGE sql AS $$
    INSERT INTO pgfifo.job_attempt AS a (job_id, attempt, runner)
    SELECT t.id, coalesce(m.n, 0) + 1, p_runner
    FROM unnest(p_ids, p_max) AS t(id, max_attempts)
    CROSS JOIN LATERAL (SELECT max(x.attempt) AS n FROM pgfifo.job_attempt x WHERE x.job_id = t.id) AS m
    WHERE coalesce(m.n, 0) < t.max_attempts
    RETURNING a.job_id, a.attempt
$$;

-- Writes the outcome of an attempt, in the job's transaction, just before it
-- commits. p_outcome is 'succeeded', 'retry', 'failed' or 'cancelled'. A
-- retry keeps the job at the head of its group until p_retry_delay_us passes;
-- any other outcome advances the head.
CREATE FUNCTION pgfifo.complete(
    p_id               bigint,
    p_attempt          integer,
    p_outcome          text,
    p_error            text,
    p_result           jsonb,
    p_retry_delay_us   bigint
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_job record;
    v_now timestamptz := clock_timestamp();
BEGIN
    IF p_outcome NOT IN ('succeeded', 'retry', 'failed', 'cancelled') THEN
        RAISE EXCEPTION 'pgfifo complete: unknown outcome %', p_outcome;
    END IF;
    SELECT queue, group_id INTO v_job FROM pgfifo.job WHERE id = p_id;
    -- Advance first: the exclusive advisory lock is taken before this
    -- transaction modifies the job row, so it never waits while holding a
    -- change an enqueuer's unique-key check would wait for.
    IF v_job.group_id IS NOT NULL AND p_outcome <> 'retry' THEN
        PERFORM pgfifo.advance_head(v_job.queue, v_job.group_id, p_id);
    END IF;
    UPDATE pgfifo.job SET
        state       = CASE WHEN p_outcome = 'retry' THEN 'queued' ELSE p_outcome END,
        attempts    = p_attempt,
        last_error  = coalesce(p_error, last_error),
        result      = p_result,
        run_after   = CASE WHEN p_outcome = 'retry'
                           THEN v_now + p_retry_delay_us * interval '1 microsecond'
                           ELSE run_after END,
        finished_at = CASE WHEN p_outcome = 'retry' THEN NULL ELSE v_now END
    WHERE id = p_id;
    IF p_error IS NOT NULL THEN
        UPDATE pgfifo.job_attempt SET error = p_error, finished_at = v_now
        WHERE job_id = p_id AND attempt = p_attempt;
    END IF;
    IF v_job.group_id IS NOT NULL AND p_outcome = 'retry' THEN
        UPDATE pgfifo.queue_group
        SET ready_at = v_now + p_retry_delay_us * interval '1 microsecond'
        WHERE queue = v_job.queue AND group_id = v_job.group_id;
    END IF;
END
$$;

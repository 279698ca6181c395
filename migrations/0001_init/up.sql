-- pgfifo schema, version 1.
--
-- Everything lives in the `pgfifo` schema (created by the migration runner,
-- which also keeps its own bookkeeping table `pgfifo.schema_migrations`).
-- docs/locking.md explains the design; the comments here state the contracts.

-- Job ids come from one sequence: order inside a group is id order, never a
-- timestamp (a batch insert gives every row the same now()).
CREATE SEQUENCE pgfifo.job_id_seq AS bigint;

-- Queue and group names are compared byte by byte (COLLATE "C") in every
-- table: they are identifiers, not prose, and the hot paths' index lookups
-- compare them all the time. With the database's collation (C.UTF-8,
-- en_US.UTF-8, ...) each comparison goes through strcoll.
CREATE TABLE pgfifo.job (
    id           bigint      PRIMARY KEY DEFAULT nextval('pgfifo.job_id_seq'),
    queue        text        COLLATE "C" NOT NULL CHECK (octet_length(queue) BETWEEN 1 AND 128),
    -- NULL: an ungrouped job, serialized with nothing.
    group_id     text        COLLATE "C" CHECK (octet_length(group_id) BETWEEN 1 AND 256),
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
    -- Attempts made before the last manual retry: the job may make
    -- max_attempts more after it (see pgfifo.retry_jobs).
    attempt_base integer     NOT NULL DEFAULT 0,
    run_after    timestamptz NOT NULL DEFAULT now(),
    unique_key   text,
    result       jsonb,
    last_error   text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz
) WITH (autovacuum_vacuum_scale_factor = 0.02);
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

-- Operators' views of the states that need attention. Both stay small and
-- cost nothing on the hot path: a job enters them only when it fails or is
-- retried (an update that rewrites its index entries anyway).
CREATE INDEX job_failed_idx ON pgfifo.job (queue, group_id, id) WHERE state = 'failed';
CREATE INDEX job_retrying_idx ON pgfifo.job (queue, group_id, id)
    WHERE state = 'queued' AND attempts > 0;

-- Per-queue estimates of the final states, which are not counted (see
-- docs/operations.md): ANALYZE keeps the common (queue, state) pairs.
CREATE STATISTICS pgfifo.job_queue_state (mcv) ON queue, state FROM pgfifo.job;

-- One row per (queue, group) that has had a job.
--
-- The row is the group's mutex: a runner holds FOR UPDATE on it for the whole
-- run of the group's head job. It also carries the group's head, so a pick
-- finds a free group and its head by index lookups whatever the backlog:
--   head_id  = the oldest unfinished job of the group (NULL when idle);
--   priority = the head's priority;
--   ready_at = NULL when idle, otherwise the head may start once ready_at has
--              passed. While successive heads are ready at once it is left
--              unchanged, so advancing the head changes no indexed column.
--   slot     = a fixed hash of the group: its place in the pick's fair order.
-- head_id is in no index, so the update that advances a head is a HOT update:
-- no new index entries, and dead versions are pruned within the page, which
-- fillfactor leaves room for. Otherwise every job would leave a dead entry at
-- the front of the index every pick walks.
--
-- Who writes head_id: the runner holding the row (advance_head, on
-- completion), and the runner's promote step for groups an enqueuer found
-- idle (through pgfifo.group_wake). Enqueuers never write this table, so an
-- enqueue never waits for another transaction's group row.
CREATE TABLE pgfifo.queue_group (
    queue      text        COLLATE "C" NOT NULL,
    group_id   text        COLLATE "C" NOT NULL,
    slot       integer     NOT NULL,
    head_id    bigint,
    priority   smallint    NOT NULL DEFAULT 0,
    ready_at   timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    -- When the group last went idle (retention drops long-idle rows).
    idle_since timestamptz,
    PRIMARY KEY (queue, group_id)
) WITH (fillfactor = 50,
        autovacuum_vacuum_scale_factor = 0.01,
        autovacuum_vacuum_threshold = 1000);

-- The grouped pick: active groups by priority, then slot.
CREATE INDEX queue_group_ready_idx ON pgfifo.queue_group (queue, priority DESC, slot)
    WHERE ready_at IS NOT NULL;

-- A group is *held* when its head failed for good in a queue whose failure
-- policy is 'hold': head_id names the failed job and ready_at is NULL, so no
-- pick sees it and promote leaves it alone until an operator retries or skips
-- the head. Few rows; the index lists them for status.
CREATE INDEX queue_group_held_idx ON pgfifo.queue_group (queue, group_id)
    WHERE ready_at IS NULL AND head_id IS NOT NULL;

-- Per-queue settings an operator changes at run time. A queue without a row
-- has the defaults.
CREATE TABLE pgfifo.queue_setting (
    queue          text        COLLATE "C" PRIMARY KEY,
    -- A paused queue keeps accepting jobs; no runner starts one.
    paused         boolean     NOT NULL DEFAULT false,
    -- What a head that failed for good does to its group: 'continue' (the
    -- group goes on) or 'hold' (the group waits for an operator).
    failure_policy text        NOT NULL DEFAULT 'continue'
                               CHECK (failure_policy IN ('continue', 'hold')),
    updated_at     timestamptz NOT NULL DEFAULT now()
);

-- Paused groups. Pausing must not wait for the group's running job, which
-- holds its queue_group row, so the pause is a row here: the next pick that
-- locks the group sees it and parks the group (makes it idle); promote leaves
-- paused groups idle; resuming deletes the row and wakes the group.
CREATE TABLE pgfifo.group_pause (
    queue     text        COLLATE "C" NOT NULL,
    group_id  text        COLLATE "C" NOT NULL,
    paused_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, group_id)
);

-- Live runners, written by each runner every few seconds (never per job):
-- what status reports as running, and who is alive.
CREATE TABLE pgfifo.runner (
    name         text        PRIMARY KEY,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    queues       text[]      NOT NULL,
    -- Jobs running now, per queue: {"queue": n}.
    running      jsonb       NOT NULL DEFAULT '{}'
);

-- Groups that an enqueuer found missing or idle, to be made active by a
-- runner (pgfifo.promote) once the enqueuing transaction has committed.
-- Insert-only for enqueuers, no unique key: an insert never waits.
CREATE TABLE pgfifo.group_wake (
    queue    text COLLATE "C" NOT NULL,
    group_id text COLLATE "C" NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0,
        autovacuum_vacuum_threshold = 200);
CREATE INDEX group_wake_queue_idx ON pgfifo.group_wake (queue);

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

-- The fixed hash of a group: its slot in the pick's round-robin order.
CREATE FUNCTION pgfifo.group_hash(p_queue text, p_group text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN hashtext(p_queue || chr(31) || p_group);

-- The advisory lock key of a group (see enqueue and advance_head), in
-- pgfifo's own two-key space (class 0x70676666, "pgff") so it never meets the
-- application's advisory locks. Groups share 1024 stripes per queue, so a
-- batch into any number of groups holds at most 1024 locks (PostgreSQL's lock
-- table is shared and small). Two groups in one stripe only make advance_head
-- put off declaring one of them idle for a moment.
CREATE FUNCTION pgfifo.group_lock_key(p_queue text, p_group text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (hashtext(p_queue) & ~1023) | (hashtext(p_queue || chr(31) || p_group) & 1023);

-- When a new job may run: an absolute time (µs since the epoch), a delay from
-- the server's clock (µs), or now.
CREATE FUNCTION pgfifo.run_after(p_run_at_us bigint, p_delay_us bigint) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE
    WHEN p_run_at_us IS NOT NULL THEN to_timestamp(p_run_at_us / 1000000.0)
    WHEN p_delay_us IS NOT NULL THEN now() + p_delay_us * interval '1 microsecond'
    ELSE now()
END;

-- Microseconds from p_now until p_at (0 when p_at has passed).
CREATE FUNCTION pgfifo.micros_until(p_at timestamptz, p_now timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN greatest(0, extract(epoch FROM p_at - p_now) * 1000000)::bigint;

-- Enqueues a batch of jobs in one call; returns one id per input row, in input
-- order (for a row whose unique key is taken, the id of the unfinished job that
-- holds it), as one array: a row per id costs more than the insert of a small
-- job, on the server and in the client.
--
-- Locking contract. The enqueuer takes the shared advisory lock of every group
-- it writes to (striped, see group_lock_key) and keeps it until its
-- transaction ends. It never writes a
-- queue_group row: for a group that is missing or idle (no head) it appends a
-- row to pgfifo.group_wake, and a runner makes the group active after this
-- transaction commits (promote). A group that is active needs nothing: its
-- runner finds the new job when it advances the head. The one race, a runner
-- declaring the group idle while this transaction is open, is closed by the
-- advisory lock: advance_head declares a group idle only if it can take the
-- lock exclusively (so no enqueuer is in flight), or it did so first, and the
-- statement below that looks for active groups sees the group idle.
--
-- Enqueue waits for nothing but that exclusive lock, held by a runner for the
-- moment between declaring a group idle and committing. Needs READ COMMITTED:
-- each statement must see commits that happened while it waited.
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
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pgfifo enqueue requires READ COMMITTED isolation (found %)',
            current_setting('transaction_isolation');
    END IF;
    IF v_n IS NULL OR v_n = 0 THEN
        RETURN '{}';
    END IF;

    -- One job without a unique key, the common call: the same steps as
    -- below, written for one row in two queries (the job, and the wake row
    -- with its notification). Lock, id and the notification of an ungrouped
    -- job are assignments of plain expressions, which PL/pgSQL evaluates
    -- without starting a query (PERFORM would start one; the functions
    -- return void, hence the casts). Less than half the server's time of the
    -- batch path for one job.
    IF v_n = 1 AND p_unique_key[1] IS NULL THEN
        IF p_group[1] IS NOT NULL THEN
            v_void := pg_advisory_xact_lock_shared(
                1885824614, pgfifo.group_lock_key(p_queue[1], p_group[1]))::text;
        END IF;
        v_id := nextval('pgfifo.job_id_seq');
        INSERT INTO pgfifo.job (id, queue, group_id, kind, payload, priority, max_attempts, run_after)
        VALUES (v_id, p_queue[1], p_group[1], p_kind[1], p_payload[1], p_priority[1],
                p_max_attempts[1], pgfifo.run_after(p_run_at_us[1], p_delay_us[1]));
        IF p_group[1] IS NULL THEN
            v_void := pg_notify('pgfifo', p_queue[1])::text;
        ELSE
            WITH woken AS (
                INSERT INTO pgfifo.group_wake (queue, group_id)
                SELECT p_queue[1], p_group[1]
                WHERE NOT EXISTS (SELECT 1 FROM pgfifo.queue_group AS qg
                                  WHERE qg.queue = p_queue[1] AND qg.group_id = p_group[1]
                                    AND qg.ready_at IS NOT NULL)
                RETURNING queue)
            SELECT pg_notify('pgfifo_groups', woken.queue)::text INTO v_void FROM woken;
        END IF;
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

    -- Groups that are missing or idle must be made active once this commits
    -- (with unique keys, only those that got a new job).
    IF array_position(v_created, false) IS NOT NULL THEN
        SELECT array_agg(d.q), array_agg(d.g) INTO v_gq, v_gg
        FROM (SELECT DISTINCT t.q, t.g FROM unnest(p_queue, p_group, v_created) AS t(q, g, created)
              WHERE t.g IS NOT NULL AND t.created) AS d;
    END IF;
    WITH woken AS (
        INSERT INTO pgfifo.group_wake (queue, group_id)
        SELECT d.q, d.g
        FROM unnest(v_gq, v_gg) AS d(q, g)
        WHERE NOT EXISTS (SELECT 1 FROM pgfifo.queue_group AS qg
                          WHERE qg.queue = d.q AND qg.group_id = d.g AND qg.ready_at IS NOT NULL)
        RETURNING queue)
    SELECT array_agg(DISTINCT queue) INTO v_notify FROM woken;

    -- Wake runners at commit, once per queue that has a woken group (they
    -- promote it, and wake a lane per group promoted) or a new ungrouped job
    -- (they wake a lane). Active groups need no wake-up: their runner
    -- advances.
    PERFORM pg_notify('pgfifo_groups', q) FROM unnest(v_notify) AS q;
    IF p_group IS NULL OR array_position(p_group, NULL::text) IS NOT NULL THEN
        PERFORM pg_notify('pgfifo', s.q)
        FROM (SELECT DISTINCT t.q FROM unnest(p_queue, p_group, v_created) AS t(q, g, created)
              WHERE t.g IS NULL AND t.created) AS s(q);
    END IF;

    RETURN v_out;
END
$$;

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
CREATE FUNCTION pgfifo.promote(
    p_queues           text[],
    p_limit            integer,
    OUT promoted       integer,
    OUT ready_later_us bigint[]
)
LANGUAGE plpgsql
-- Short queries on small tables: compiling them would cost 100x running them.
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_wake  record;
    v_taken integer := 0;
    v_group record;
    v_next  record;
    v_locked boolean;
    v_now   timestamptz := clock_timestamp();
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    FOR v_wake IN
        WITH taken AS (
            DELETE FROM pgfifo.group_wake
            WHERE ctid = ANY (ARRAY(SELECT ctid FROM pgfifo.group_wake
                                    WHERE queue = ANY (p_queues)
                                    LIMIT p_limit FOR UPDATE SKIP LOCKED))
            RETURNING queue, group_id)
        SELECT queue, group_id, count(*) AS n FROM taken GROUP BY 1, 2 ORDER BY 1, 2
    LOOP
        -- The group row, locked, and whether the group is paused. Not found:
        -- missing (created here), or locked by someone else.
        FOR v_try IN 1 .. 2 LOOP
            SELECT g.head_id, g.ready_at,
                   EXISTS (SELECT 1 FROM pgfifo.group_pause AS p
                           WHERE p.queue = g.queue AND p.group_id = g.group_id) AS paused
            INTO v_group FROM pgfifo.queue_group AS g
            WHERE g.queue = v_wake.queue AND g.group_id = v_wake.group_id
            FOR NO KEY UPDATE OF g SKIP LOCKED;
            v_locked := FOUND;
            -- (A row someone holds is not inserted again: the insert would
            -- wait for a transaction that updated it.)
            EXIT WHEN v_locked OR v_try = 2
                   OR EXISTS (SELECT 1 FROM pgfifo.queue_group AS g
                              WHERE g.queue = v_wake.queue AND g.group_id = v_wake.group_id);
            INSERT INTO pgfifo.queue_group (queue, group_id, slot)
            VALUES (v_wake.queue, v_wake.group_id, pgfifo.group_hash(v_wake.queue, v_wake.group_id))
            ON CONFLICT (queue, group_id) DO NOTHING;
        END LOOP;
        IF NOT v_locked THEN
            INSERT INTO pgfifo.group_wake (queue, group_id) VALUES (v_wake.queue, v_wake.group_id);
            CONTINUE;
        END IF;
        v_taken := v_taken + v_wake.n;
        IF v_group.head_id IS NOT NULL AND v_group.ready_at IS NULL THEN
            -- Held: stays so while its head is failed and its queue holds.
            CONTINUE WHEN EXISTS (SELECT 1 FROM pgfifo.job AS j
                                  WHERE j.id = v_group.head_id AND j.state = 'failed')
                      AND EXISTS (SELECT 1 FROM pgfifo.queue_setting AS s
                                  WHERE s.queue = v_wake.queue AND s.failure_policy = 'hold');
        END IF;
        CONTINUE WHEN v_group.paused;
        SELECT j.id, j.priority, j.run_after INTO v_next FROM pgfifo.job AS j
        WHERE j.queue = v_wake.queue AND j.group_id = v_wake.group_id AND j.state = 'queued'
        ORDER BY j.id LIMIT 1;
        IF NOT FOUND THEN
            IF v_group.head_id IS NOT NULL AND v_group.ready_at IS NULL THEN
                -- A released held group with nothing behind its head: idle.
                -- (Enqueuers see a held group as inactive and always wake
                -- it, so declaring it idle misses none of them.)
                UPDATE pgfifo.queue_group SET head_id = NULL, idle_since = now()
                WHERE queue = v_wake.queue AND group_id = v_wake.group_id;
            END IF;
            CONTINUE;
        END IF;
        IF v_group.ready_at IS NOT NULL THEN
            -- Active: only an older job, and only before the head started.
            CONTINUE WHEN v_next.id >= v_group.head_id;
            CONTINUE WHEN EXISTS (SELECT 1 FROM pgfifo.job_attempt AS a
                                  WHERE a.job_id = v_group.head_id);
        END IF;
        UPDATE pgfifo.queue_group
        SET head_id = v_next.id, priority = v_next.priority, ready_at = v_next.run_after,
            idle_since = NULL
        WHERE queue = v_wake.queue AND group_id = v_wake.group_id;
        IF v_next.run_after > v_now THEN
            ready_later_us := ready_later_us
                              || pgfifo.micros_until(v_next.run_after, clock_timestamp());
        END IF;
    END LOOP;
    promoted := v_taken;
END
$$;

-- Makes the oldest queued job of a group (other than p_done, which the caller
-- is finishing) its head, or marks the group idle.
--
-- The caller holds the group's queue_group row FOR UPDATE. Before declaring
-- the group idle it must know that no enqueuer of the group is still inside
-- its transaction (its job would be invisible here, and the enqueuer, seeing
-- the group active, would not wake it). Enqueuers hold the group's advisory
-- lock shared until they end; this tries it exclusively, without waiting:
--   * granted: no enqueuer is in flight; look again with a fresh snapshot. A
--     job committed by then is seen; an enqueuer that comes later waits for
--     this transaction (a moment: complete is its last statement) and then
--     finds the group idle and wakes it;
--   * not granted: leave the finished job as the group's head, with ready_at
--     a little ahead. The group stays active, so enqueuers need do nothing;
--     the next pick of it finds a finished head and calls this again.
-- Never waiting here is what keeps enqueues from waiting for running jobs
-- and jobs from deadlocking with each other's enqueues.
--
-- In the common case (the next head is ready now, same priority) only head_id
-- changes, which makes the update a HOT update (see queue_group).
--
-- Returns in how many microseconds the group's head is ready (0: now, and
-- the runner picks again rather than wait for a wake-up; NULL: the group is
-- idle). Nobody is woken for a head that becomes ready later: the runner
-- looks again by then.
CREATE FUNCTION pgfifo.advance_head(p_queue text, p_group text, p_done bigint) RETURNS bigint
LANGUAGE plpgsql
-- Index-driven whatever the statistics, never JIT-compiled (see pick).
SET enable_sort = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_next record;
    v_now  timestamptz := clock_timestamp();
BEGIN
    SELECT id, priority, run_after INTO v_next FROM pgfifo.job
    WHERE queue = p_queue AND group_id = p_group AND state = 'queued' AND id <> p_done
    ORDER BY id LIMIT 1;
    IF NOT FOUND THEN
        IF NOT pg_try_advisory_xact_lock(1885824614, pgfifo.group_lock_key(p_queue, p_group)) THEN
            UPDATE pgfifo.queue_group
            SET head_id = p_done, ready_at = v_now + interval '50 milliseconds'
            WHERE queue = p_queue AND group_id = p_group;
            RETURN 50000;
        END IF;
        SELECT id, priority, run_after INTO v_next FROM pgfifo.job
        WHERE queue = p_queue AND group_id = p_group AND state = 'queued' AND id <> p_done
        ORDER BY id LIMIT 1;
    END IF;
    IF v_next.id IS NULL THEN
        UPDATE pgfifo.queue_group SET head_id = NULL, ready_at = NULL, idle_since = v_now
        WHERE queue = p_queue AND group_id = p_group;
        RETURN NULL;
    END IF;
    UPDATE pgfifo.queue_group
    SET head_id  = v_next.id,
        priority = v_next.priority,
        ready_at = CASE WHEN v_next.run_after <= v_now AND ready_at <= v_now
                        THEN ready_at ELSE v_next.run_after END
    WHERE queue = p_queue AND group_id = p_group;
    RETURN pgfifo.micros_until(v_next.run_after, v_now);
END
$$;

-- Picks up to p_limit jobs to run, of different groups, and locks them.
-- Called as the first statement of the runner's job transaction T, after
-- BEGIN. The jobs then run one after another in T (each handler in its own
-- savepoint; see the runner's execute module for when several share T).
--
-- Locking contract: for every row with a job id returned, T holds
--   * FOR UPDATE on the job's queue_group row (grouped jobs): no other runner
--     can pick any job of the group until T ends;
--   * FOR UPDATE on the job row;
-- until T commits (outcomes written) or aborts (crash, lost connection,
-- shutdown, idle timeout): then each job is still its group's head and runs
-- again.
--
-- The group row is locked first, SKIP LOCKED. Under READ COMMITTED, locking
-- re-reads the newest committed version of the row, so head_id is the head as
-- of the moment the lock was taken, even if the statement's snapshot is older.
-- The job row is then read and locked in a separate statement, whose snapshot
-- is taken after the group lock was granted. Reading the head from the job
-- table in the same statement as the group lock would use a snapshot that can
-- predate the commit of the job that freed the group, and run it twice.
--
-- Which groups: the highest priority first; within a priority, free ready
-- groups from slot p_slot on, wrapping around. Each worker passes the slot
-- after the last one it served, so it sweeps the groups round-robin: every
-- group with work is served once per sweep, none can keep the workers to
-- itself, and concurrent pickers work at different places of the index
-- instead of all fighting over its first rows. The returned slot is the
-- group's (NULL for an ungrouped job). p_turn rotates the starting queue and
-- alternates between grouped and ungrouped jobs so neither starves.
--
-- Each job row's `more` says whether more work may be ready: the walk ended
-- at its cap (see below), or it took p_limit jobs and another group is
-- ready or an ungrouped job is queued. p_held lists the jobs the caller's
-- other lanes hold: their groups are not work left (their lanes look again
-- for what follows them); a group held by another runner counts as ready.
-- The runner then picks again after these jobs instead of waiting for a
-- wake-up. (Their locks are still tried: a lane whose connection was cut
-- holds nothing any more while its handler runs on, and its job must run
-- again at once.)
--
-- A single row whose id is NULL means: a group was locked that turned out to
-- have nothing to run (or was parked, see below); commit (releasing it) and
-- pick again. That happens only when nothing was picked before it: a group
-- that turns out empty after a job was picked is skipped (its lock is kept
-- until T ends, which only delays it a moment).
--
-- A worker that stops without closing its connection (frozen by SIGSTOP, a
-- stalled VM) would hold its groups forever. pick therefore bounds how long T
-- may sit idle: p_idle_ms[i] for jobs of kind p_kinds[i], p_default_idle_ms
-- for others (the runner passes each type's timeout plus a grace); with
-- several jobs, the longest of theirs. Past it, the server ends the session,
-- T aborts and the groups are free. (A peer that vanished from the network is
-- detected by TCP keepalives: see docs/failure-model.md for the connection
-- settings.)
CREATE FUNCTION pgfifo.pick(
    p_queues          text[],
    p_turn            integer,
    p_slot            integer,
    p_kinds           text[],
    p_idle_ms         integer[],
    p_default_idle_ms integer,
    p_limit           integer,
    p_held            bigint[] DEFAULT '{}'
)
RETURNS TABLE (id bigint, queue text, group_id text, kind text, payload jsonb,
               max_attempts integer, slot integer, more boolean)
LANGUAGE plpgsql
-- The plans must not depend on statistics (a fresh queue has none): without
-- these, the planner may read every group of the queue through the primary
-- key and sort them, instead of walking the ready index to the first free row.
-- The penalties these settings add to the costs of other plans could push a
-- query past the JIT thresholds; compiling would cost 100x running it.
SET enable_sort = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_n       integer := cardinality(p_queues);
    v_turn    bigint := p_turn::bigint & 2147483647;
    v_limit   integer := greatest(coalesce(p_limit, 1), 1);
    v_count   integer := 0;
    v_ids     bigint[] := '{}';
    v_jobs    pgfifo.job[] := '{}';
    v_slots   integer[] := '{}';
    v_more    boolean := false;
    v_seen    integer := 0;
    v_idle    integer := 0;
    v_q       text;
    v_group   record;
    v_cand    record;
    v_lo      bigint;
    v_hi      bigint;
    v_job     pgfifo.job;
    v_slot    integer := p_slot;
    v_now     timestamptz := statement_timestamp();
    v_bound   integer;
    v_prio    smallint;
BEGIN
    -- Locks taken here must outlive this statement. In autocommit they would
    -- be released at once, and the caller would run a job it does not hold.
    -- The runner opens job transactions with BEGIN and a transaction-local
    -- marker; if that BEGIN was skipped (the COMMIT before it failed), the
    -- marker is absent.
    IF current_setting('pgfifo.job_transaction', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION 'pgfifo.pick must run in a job transaction (BEGIN; SELECT set_config(''pgfifo.job_transaction'', ''on'', true))';
    END IF;
    <<queues>>
    FOR v_i IN 0 .. coalesce(v_n, 0) - 1 LOOP
        v_q := p_queues[1 + (v_turn + v_i) % v_n];
        CONTINUE WHEN EXISTS (SELECT 1 FROM pgfifo.queue_setting AS s
                              WHERE s.queue = v_q AND s.paused);
        FOR v_kind IN 0 .. 1 LOOP
            IF (v_kind + v_turn) % 2 = 0 THEN
                v_bound := 32768;
                LOOP
                    -- The next priority level that has active groups.
                    SELECT g.priority INTO v_prio FROM pgfifo.queue_group AS g
                    WHERE g.queue = v_q AND g.ready_at IS NOT NULL AND g.priority < v_bound
                    ORDER BY g.priority DESC LIMIT 1;
                    EXIT WHEN NOT FOUND;
                    -- Candidates are read without locks, from the cursor to the
                    -- end of the level, then from its start to the cursor. Each
                    -- is then locked by its key. (A locking scan with the
                    -- readiness conditions would keep the lock of a row that
                    -- stopped matching between snapshot and lock, such as a
                    -- group that just went idle, for the whole job.)
                    FOR v_pass IN 0 .. 1 LOOP
                        IF v_pass = 0 THEN
                            v_lo := v_slot;
                            v_hi := 2147483647;
                        ELSE
                            v_lo := -2147483648;
                            v_hi := v_slot::bigint - 1;
                        END IF;
                        FOR v_cand IN
                            SELECT g.group_id FROM pgfifo.queue_group AS g
                            WHERE g.queue = v_q AND g.ready_at IS NOT NULL AND g.priority = v_prio
                              AND g.slot BETWEEN v_lo AND v_hi AND g.ready_at <= v_now
                            ORDER BY g.slot
                        LOOP
                            -- A busy queue has more active groups than free
                            -- ones: once jobs are picked, stop looking after a
                            -- while instead of trying every group's lock.
                            v_seen := v_seen + 1;
                            v_more := v_count > 0 AND v_seen > 2 * v_limit + 8;
                            EXIT queues WHEN v_more;
                            -- (A pause committed while this statement runs is
                            -- seen by the next pick.)
                            SELECT g.queue, g.group_id, g.head_id, g.slot, g.ready_at,
                                   EXISTS (SELECT 1 FROM pgfifo.group_pause AS p
                                           WHERE p.queue = g.queue AND p.group_id = g.group_id) AS paused
                            INTO v_group
                            FROM pgfifo.queue_group AS g
                            WHERE g.queue = v_q AND g.group_id = v_cand.group_id
                            FOR UPDATE OF g SKIP LOCKED;
                            CONTINUE WHEN NOT FOUND; -- busy: another runner holds it
                            -- Taken by this very pick already: a lock this
                            -- transaction holds is granted to it again (the group
                            -- can turn up at a lower priority level, whose read
                            -- comes later).
                            CONTINUE WHEN v_group.head_id = ANY (v_ids);
                            IF v_group.ready_at IS NULL OR v_group.ready_at > v_now OR v_group.head_id IS NULL
                               OR v_group.paused THEN
                                -- Jobs are picked already: leave this group to
                                -- a later pick (see above).
                                CONTINUE WHEN v_count > 0;
                                -- It changed since the candidate read (went idle, or
                                -- its head is now waiting for a retry), or it is
                                -- paused: park it (idle until resumed; its jobs
                                -- stay queued). Parking declares the group idle,
                                -- so it follows advance_head's protocol: only
                                -- with the group's advisory lock (no enqueuer in
                                -- flight, whose job resume's promote would not
                                -- see), else try again in a moment. This lock
                                -- lasts until T ends: return at once, and the
                                -- caller commits and picks again.
                                IF v_group.ready_at IS NOT NULL AND v_group.ready_at <= v_now
                                   AND v_group.head_id IS NOT NULL THEN
                                    IF pg_try_advisory_xact_lock(1885824614,
                                                                 pgfifo.group_lock_key(v_q, v_group.group_id)) THEN
                                        UPDATE pgfifo.queue_group AS g
                                        SET head_id = NULL, ready_at = NULL, idle_since = v_now
                                        WHERE g.queue = v_q AND g.group_id = v_group.group_id;
                                    ELSE
                                        UPDATE pgfifo.queue_group AS g
                                        SET ready_at = v_now + interval '50 milliseconds'
                                        WHERE g.queue = v_q AND g.group_id = v_group.group_id;
                                    END IF;
                                END IF;
                                RETURN QUERY SELECT NULL::bigint, v_q, v_group.group_id, NULL::text,
                                                    NULL::jsonb, NULL::integer, v_group.slot, NULL::boolean;
                                RETURN;
                            END IF;
                            SELECT * INTO v_job FROM pgfifo.job AS j
                            WHERE j.id = v_group.head_id AND j.state = 'queued'
                            FOR UPDATE SKIP LOCKED;
                            IF NOT FOUND THEN
                                CONTINUE WHEN v_count > 0;
                                IF EXISTS (SELECT 1 FROM pgfifo.job AS j
                                           WHERE j.id = v_group.head_id AND j.state = 'queued') THEN
                                    -- Locked by an operator's transaction (never by
                                    -- a runner without the group): leave the group
                                    -- to it.
                                    RETURN QUERY SELECT NULL::bigint, v_q, v_group.group_id, NULL::text,
                                                        NULL::jsonb, NULL::integer, v_group.slot, NULL::boolean;
                                    RETURN;
                                END IF;
                                -- The head was finished or deleted out of band.
                                -- Repair the pointer; the row stays locked until T
                                -- ends, so run this group's new head or nothing.
                                PERFORM pgfifo.advance_head(v_group.queue, v_group.group_id, v_group.head_id);
                                SELECT j.* INTO v_job
                                FROM pgfifo.queue_group AS g
                                JOIN pgfifo.job AS j ON j.id = g.head_id
                                WHERE g.queue = v_group.queue AND g.group_id = v_group.group_id
                                  AND g.ready_at <= v_now AND j.state = 'queued'
                                FOR UPDATE OF j SKIP LOCKED;
                                IF NOT FOUND THEN
                                    RETURN QUERY SELECT NULL::bigint, v_q, v_group.group_id, NULL::text,
                                                        NULL::jsonb, NULL::integer, v_group.slot, NULL::boolean;
                                    RETURN;
                                END IF;
                            END IF;
                            v_jobs := v_jobs || v_job;
                            v_slots := v_slots || v_group.slot;
                            v_ids := v_ids || v_job.id;
                            v_count := v_count + 1;
                            EXIT queues WHEN v_count >= v_limit;
                        END LOOP;
                    END LOOP;
                    v_bound := v_prio;
                END LOOP;
            ELSE
                FOR v_job IN
                    SELECT * FROM pgfifo.job AS j
                    WHERE j.queue = v_q AND j.group_id IS NULL AND j.state = 'queued' AND j.run_after <= v_now
                      AND j.id <> ALL (v_ids)
                    ORDER BY j.priority DESC, j.run_after, j.id
                    LIMIT v_limit - v_count
                    FOR UPDATE SKIP LOCKED
                LOOP
                    v_jobs := v_jobs || v_job;
                    v_slots := v_slots || NULL::integer;
                    v_ids := v_ids || v_job.id;
                    v_count := v_count + 1;
                END LOOP;
                EXIT queues WHEN v_count >= v_limit;
            END IF;
        END LOOP;
    END LOOP;
    -- A pick that took all it could may have left other work ready: look
    -- (without locks; a ready group that another runner holds counts too).
    -- Jobs taken or held by the caller's lanes are not left work: at a few
    -- hundred jobs a second, counting them sent most lanes to pick again
    -- after every job, to find nothing.
    IF v_count >= v_limit AND NOT v_more THEN
        v_ids := v_ids || coalesce(array_remove(p_held, NULL), '{}');
        v_more := EXISTS (SELECT 1 FROM pgfifo.queue_group AS g
                          WHERE g.queue = ANY (p_queues) AND g.ready_at IS NOT NULL
                            AND g.ready_at <= v_now AND NOT g.head_id = ANY (v_ids))
               OR EXISTS (SELECT 1 FROM pgfifo.job AS j
                          WHERE j.queue = ANY (p_queues) AND j.group_id IS NULL
                            AND j.state = 'queued' AND j.run_after <= v_now
                            AND NOT j.id = ANY (v_ids));
    END IF;
    -- The jobs are returned once the walk is over, so that each row can say
    -- whether more work may be ready (the walk stopped at its cap, or work
    -- was left above): the caller then looks again after these jobs instead
    -- of waiting for a wake-up. (RETURN NEXT of the output columns, not
    -- RETURN QUERY: no query to start per job.)
    FOR v_i IN 1 .. v_count LOOP
        v_job := v_jobs[v_i];
        v_idle := greatest(v_idle, coalesce(p_idle_ms[array_position(p_kinds, v_job.kind)],
                                            p_default_idle_ms));
        id := v_job.id;
        queue := v_job.queue;
        group_id := v_job.group_id;
        kind := v_job.kind;
        payload := v_job.payload;
        max_attempts := v_job.max_attempts + v_job.attempt_base;
        slot := v_slots[v_i];
        more := v_more;
        RETURN NEXT;
    END LOOP;
    IF v_count > 0 THEN
        PERFORM set_config('idle_in_transaction_session_timeout', v_idle::text, true);
    END IF;
END
$$;

-- Records the start of an attempt for each job, in autocommit, outside the
-- jobs' transactions. Returns the attempt number of each job that still has
-- attempts left; a job missing from the result has used them all (earlier
-- attempts were interrupted) and must be marked failed. The caller holds each
-- job's locks, so no one else records attempts of these jobs concurrently.
--
-- The commit does not wait for the WAL flush (synchronous_commit is off for
-- this transaction only): the record is visible at once and durable within
-- the WAL writer's delay. A crash of the runner's process loses nothing; a
-- crash of the server can lose the newest records, giving those jobs one
-- extra attempt.
CREATE FUNCTION pgfifo.start_attempts(p_ids bigint[], p_max integer[], p_runner text)
RETURNS TABLE (job_id bigint, attempt integer)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN QUERY
    INSERT INTO pgfifo.job_attempt AS a (job_id, attempt, runner)
    SELECT t.id, coalesce(m.n, 0) + 1, p_runner
    FROM unnest(p_ids, p_max) AS t(id, max_attempts)
    CROSS JOIN LATERAL (SELECT max(x.attempt) AS n FROM pgfifo.job_attempt x WHERE x.job_id = t.id) AS m
    WHERE coalesce(m.n, 0) < t.max_attempts
    RETURNING a.job_id, a.attempt;
END
$$;

-- Writes the outcomes of the attempts of a pick's jobs, in their transaction,
-- just before it commits: element i of each array is job i's. p_outcomes[i]
-- is 'succeeded', 'retry', 'failed' or 'cancelled'. A retry keeps the job at
-- the head of its group until p_retry_delay_us[i] passes; any other outcome
-- advances the head. p_queues and p_groups are the jobs' (the caller has them
-- from pick); the jobs are of different groups, as pick returns them.
--
-- A grouped job that failed for good in a queue whose failure policy is
-- 'hold' stays its group's head and holds it (see queue_group).
--
-- Reports the work these jobs left that nobody is woken for: a group's next
-- head (enqueues into an active group wake nobody), a retry, a group
-- advance_head could not yet declare idle. ready_now: some is ready now (the
-- runner picks again for it); ready_later_us: in how many microseconds each
-- of the rest is ready (NULL: none), when the runner looks again.
CREATE FUNCTION pgfifo.complete(
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
SET plan_cache_mode = force_generic_plan
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
BEGIN
    -- (Array expressions, not queries: plpgsql evaluates them without
    -- starting an executor.)
    IF NOT coalesce(p_outcomes <@ ARRAY['succeeded', 'retry', 'failed', 'cancelled'], false) THEN
        RAISE EXCEPTION 'pgfifo complete: unknown outcome in %', p_outcomes;
    END IF;
    -- The jobs' transaction must still be the one that picked them: a
    -- handler that sent COMMIT itself has released their locks.
    IF current_setting('pgfifo.job_transaction', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION 'pgfifo complete: not in the job''s transaction (did the handler COMMIT?)';
    END IF;
    ready_now := false;
    -- The common case: the group has a next job, which becomes the head (a
    -- HOT update when it is ready at once). Not for retries (the job stays
    -- the head) nor for failures that hold their group. For several jobs, in
    -- one statement for all; a single job takes the cheaper statement below.
    IF v_n > 1 THEN
        WITH done AS (
            SELECT t.done_id, t.q, t.grp
            FROM unnest(p_ids, p_outcomes, p_queues, p_groups) AS t(done_id, outcome, q, grp)
            WHERE t.grp IS NOT NULL AND t.outcome <> 'retry'
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
                ORDER BY j.id LIMIT 1) AS next
            WHERE g.queue = done.q AND g.group_id = done.grp
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
        -- A retry is work that nobody is woken for either.
        IF v_outcome = 'retry' THEN
            v_ready_in := greatest(coalesce(p_retry_delay_us[v_i], 0), 0);
            ready_now := ready_now OR coalesce(v_ready_in = 0, false);
            IF v_ready_in > 0 THEN
                ready_later_us := ready_later_us || v_ready_in;
            END IF;
        END IF;
        CONTINUE WHEN v_group IS NULL OR v_id = ANY (v_moved);
        IF v_outcome = 'retry' THEN
            UPDATE pgfifo.queue_group
            SET ready_at = v_now + p_retry_delay_us[v_i] * interval '1 microsecond'
            WHERE queue = v_queue AND group_id = v_group;
        ELSIF v_outcome = 'failed'
              AND EXISTS (SELECT 1 FROM pgfifo.queue_setting AS s
                          WHERE s.queue = v_queue AND s.failure_policy = 'hold') THEN
            UPDATE pgfifo.queue_group SET head_id = v_id, ready_at = NULL
            WHERE queue = v_queue AND group_id = v_group;
        ELSE
            v_advanced := 0;
            IF v_n = 1 THEN
                WITH next AS (
                    SELECT j.id, j.priority, j.run_after FROM pgfifo.job AS j
                    WHERE j.queue = v_queue AND j.group_id = v_group AND j.state = 'queued'
                      AND j.id <> v_id
                    ORDER BY j.id LIMIT 1),
                moved AS (
                    UPDATE pgfifo.queue_group AS g
                    SET head_id  = next.id,
                        priority = next.priority,
                        ready_at = CASE WHEN next.run_after <= v_now AND g.ready_at <= v_now
                                        THEN g.ready_at ELSE next.run_after END
                    FROM next
                    WHERE g.queue = v_queue AND g.group_id = v_group
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
    IF v_n = 1 THEN
        UPDATE pgfifo.job SET
            state       = CASE WHEN v_outcome = 'retry' THEN 'queued' ELSE v_outcome END,
            attempts    = p_attempts[1],
            last_error  = coalesce(p_errors[1], last_error),
            result      = p_results[1],
            run_after   = CASE WHEN v_outcome = 'retry'
                               THEN v_now + p_retry_delay_us[1] * interval '1 microsecond'
                               ELSE run_after END,
            finished_at = CASE WHEN v_outcome = 'retry' THEN NULL ELSE v_now END
        WHERE id = v_id;
    ELSE
        UPDATE pgfifo.job AS j SET
            state       = CASE WHEN t.outcome = 'retry' THEN 'queued' ELSE t.outcome END,
            attempts    = t.attempt,
            last_error  = coalesce(t.error, j.last_error),
            result      = t.result,
            run_after   = CASE WHEN t.outcome = 'retry'
                               THEN v_now + t.delay_us * interval '1 microsecond'
                               ELSE j.run_after END,
            finished_at = CASE WHEN t.outcome = 'retry' THEN NULL ELSE v_now END
        FROM unnest(p_ids, p_attempts, p_outcomes, p_errors, p_results, p_retry_delay_us)
             AS t(id, attempt, outcome, error, result, delay_us)
        WHERE j.id = t.id;
    END IF;
    IF cardinality(array_remove(p_errors, NULL)) > 0 THEN
        UPDATE pgfifo.job_attempt AS a SET error = t.error, finished_at = v_now
        FROM unnest(p_ids, p_attempts, p_errors) AS t(id, attempt, error)
        WHERE t.error IS NOT NULL AND a.job_id = t.id AND a.attempt = t.attempt;
    END IF;
    RETURN;
END
$$;

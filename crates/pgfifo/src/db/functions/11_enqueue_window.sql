-- Enqueue with outcomes and de-duplication windows per key
-- (docs/dedup-windows.md).
--
-- Installed whole by `migrate` (CREATE OR REPLACE) after the numbered
-- migrations; see crates/pgfifo/src/migrate.rs and docs/upgrading.md for
-- how a change of arguments or result type is made. pgfifo.job_window
-- comes with the migration dedup_windows: every use of it is in a branch
-- that looks for it first (after `migrate down` it is absent).

-- Enqueues a batch like pgfifo.enqueue (same first nine arguments, same
-- locking contract: each job is enqueued by a one-row call of it) and says,
-- for each input row, what happened:
--   'created'      a new job was written; ids[i] is its id;
--   'deduplicated' a unique key held by a queued job, or a 'unique' window
--                  of the key still open: ids[i] is the existing job;
--   'debounced'    a 'debounce' window's job had not started: it got this
--                  row's payload (and, see below, its start moved to now +
--                  the quiet period); ids[i] is that job;
--   'throttled'    a 'throttle' window of the key holds for the current
--                  period-aligned slot: nothing written; ids[i] is the
--                  slot's job.
-- p_window_key, p_window_mode ('unique', 'debounce', 'throttle') and
-- p_window_us (the period, or quiet period, in microseconds) are NULL for a
-- row without a window (the arrays themselves may be NULL: none).
--
-- Rows are handled in input order, so a batch that holds one key twice gets
-- what two enqueues one after the other would get. Producers of one key are
-- serialized by a transaction-level advisory lock on (queue, key) (class
-- 1885824615, "pgfg": apart from the groups' 1885824614), taken for
-- every key of the batch first, in sorted order (no deadlock between two
-- batches): a second producer waits for the first's commit or rollback, and
-- then sees its window row (or its absence).
--
-- Debounce never waits for a runner: the job's row is locked SKIP LOCKED
-- (a job a runner holds has started), and so is its group's row, whose
-- ready_at must move with the job when the job is the group's head. When a
-- runner holds the group's row (a job of the group is running, or being
-- picked) the job's start is left as it is and only its payload is
-- replaced: moving it then could race with the runner's advance_head,
-- which would read the old start and let the job run early.
--
-- Distributed (Citus): a window's row is on its key's part (as if the key
-- were a group), its job on the job's own part, which the row keeps
-- (job_part, a column of the distributed layout only), so that every
-- statement here names the one part it reads or writes; the keys' locks
-- are taken on the coordinator, where this runs.
CREATE OR REPLACE FUNCTION pgfifo.enqueue_outcomes(
    p_queue        text[],
    p_group        text[],
    p_kind         text[],
    p_payload      jsonb[],
    p_priority     smallint[],
    p_max_attempts integer[],
    p_unique_key   text[],
    p_run_at_us    bigint[],
    p_delay_us     bigint[],
    p_window_key   text[],
    p_window_mode  text[],
    p_window_us    bigint[],
    OUT ids        bigint[],
    OUT outcomes   text[]
)
LANGUAGE plpgsql
AS $$
DECLARE
    v_n       integer := cardinality(p_queue);
    v_i       integer;
    v_key     text;
    v_mode    text;
    v_us      bigint;
    v_period  interval;
    v_windows boolean := false;
    v_w       record;
    v_job     record;
    v_id      bigint;
    v_until   timestamptz;
    v_open    boolean;
    v_movable boolean;
    v_head    bigint;
    v_at      timestamptz;
    v_slot    numeric;
    /*@dist v_wpart integer; v_jpart integer; v_payload jsonb; */
BEGIN
    ids := '{}';
    outcomes := '{}';
    IF v_n IS NULL OR v_n = 0 THEN
        RETURN;
    END IF;
    -- Every row is checked before anything is written.
    FOR v_i IN 1 .. v_n LOOP
        v_key := p_window_key[v_i];
        v_mode := p_window_mode[v_i];
        v_us := p_window_us[v_i];
        CONTINUE WHEN v_key IS NULL AND v_mode IS NULL AND v_us IS NULL;
        IF v_mode IS NULL OR v_mode NOT IN ('unique', 'debounce', 'throttle') THEN
            RAISE EXCEPTION 'pgfifo: job % window mode must be unique, debounce or throttle (got %)',
                v_i, coalesce(v_mode, 'NULL')
                USING ERRCODE = 'invalid_parameter_value', CONSTRAINT = 'pgfifo_bad_window',
                      COLUMN = 'window_mode';
        ELSIF v_key IS NULL OR octet_length(v_key) NOT BETWEEN 1 AND 256 THEN
            RAISE EXCEPTION 'pgfifo: job % has a % window without a key of 1 to 256 bytes', v_i, v_mode
                USING ERRCODE = 'invalid_parameter_value', CONSTRAINT = 'pgfifo_bad_window',
                      COLUMN = 'window_key';
        ELSIF v_us IS NULL OR v_us <= 0 THEN
            RAISE EXCEPTION 'pgfifo: job % % window period must be positive (got % us)',
                v_i, v_mode, coalesce(v_us::text, 'NULL')
                USING ERRCODE = 'invalid_parameter_value', CONSTRAINT = 'pgfifo_bad_window',
                      COLUMN = 'window_period';
        ELSIF p_unique_key[v_i] IS NOT NULL THEN
            RAISE EXCEPTION 'pgfifo: job % has both a unique_key and a % window: give one of them',
                v_i, v_mode
                USING ERRCODE = 'invalid_parameter_value', CONSTRAINT = 'pgfifo_bad_window',
                      COLUMN = 'unique_key';
        ELSIF v_mode = 'debounce' AND (p_run_at_us[v_i] IS NOT NULL OR p_delay_us[v_i] IS NOT NULL) THEN
            RAISE EXCEPTION 'pgfifo: job % is debounced: its start is now + the quiet period, '
                            'so run_at and delay must not be given', v_i
                USING ERRCODE = 'invalid_parameter_value', CONSTRAINT = 'pgfifo_bad_window',
                      COLUMN = 'run_at';
        END IF;
        v_windows := true;
    END LOOP;
    IF v_windows AND to_regclass('pgfifo.job_window') IS NULL THEN
        RAISE EXCEPTION 'pgfifo: de-duplication windows need the migration dedup_windows (pgfifo.job_window is missing): run `pgfifo migrate up`'
            USING ERRCODE = 'undefined_table', CONSTRAINT = 'pgfifo_bad_window';
    END IF;
    IF v_windows THEN
        -- The keys' locks, sorted (see above).
        PERFORM pg_advisory_xact_lock(1885824615, s.k)
        FROM (SELECT DISTINCT hashtext(t.q || chr(31) || t.k) AS k
              FROM unnest(p_queue, p_window_key) AS t(q, k)
              WHERE t.k IS NOT NULL ORDER BY 1) AS s;
    END IF;

    FOR v_i IN 1 .. v_n LOOP
        v_key := p_window_key[v_i];
        v_mode := p_window_mode[v_i];
        v_period := p_window_us[v_i] * interval '1 microsecond';
        v_w := NULL;
        v_head := NULL;
        v_open := false;
        IF v_key IS NOT NULL THEN
            /*@dist v_wpart := pgfifo.part_of(p_queue[v_i], v_key); */
            SELECT w.mode, w.job_id, w.until /*@dist , w.job_part */ INTO v_w
            FROM pgfifo.job_window AS w
            WHERE w.queue = p_queue[v_i] AND w.key = v_key /*@dist AND w.part = v_wpart */;
            IF FOUND AND v_w.mode IN ('unique', 'throttle') THEN
                v_open := v_w.until > now();
            ELSIF FOUND THEN
                -- A debounce window is open while its job is queued, has
                -- never started (a job waiting for a retry has) and no runner
                -- holds it (held: it is starting, it counts as started).
                /*@dist v_jpart := v_w.job_part; */
                SELECT j.id, j.group_id, j.kind INTO v_job FROM pgfifo.job AS j
                WHERE j.id = v_w.job_id AND j.state = 'queued' AND j.attempts = 0
                  /*@dist AND j.part = v_jpart */
                FOR NO KEY UPDATE SKIP LOCKED;
                v_open := FOUND;
            END IF;
            IF v_open AND v_w.mode <> v_mode THEN
                RAISE EXCEPTION 'pgfifo: key % of queue % is held by a % window (job %) until it ends; '
                                'this job asks for a % window',
                    v_key, p_queue[v_i], v_w.mode, v_w.job_id, v_mode
                    USING ERRCODE = 'invalid_parameter_value', CONSTRAINT = 'pgfifo_window_mode',
                          COLUMN = 'window_mode';
            END IF;
        END IF;

        IF v_open AND v_mode = 'unique' THEN
            ids := ids || v_w.job_id;
            outcomes := outcomes || 'deduplicated'::text;
        ELSIF v_open AND v_mode = 'throttle' THEN
            ids := ids || v_w.job_id;
            outcomes := outcomes || 'throttled'::text;
        ELSIF v_open THEN
            -- Debounce a queued job (locked above), of the same kind: the
            -- payload must be one its handler reads.
            IF v_job.kind <> p_kind[v_i] THEN
                RAISE EXCEPTION 'pgfifo: key % of queue % debounces job % of kind %; this job is of kind %',
                    v_key, p_queue[v_i], v_job.id, v_job.kind, p_kind[v_i]
                    USING ERRCODE = 'invalid_parameter_value', CONSTRAINT = 'pgfifo_window_mode',
                          COLUMN = 'kind';
            END IF;
            -- Its start moves only when its group's row can be held too,
            -- without waiting: then no runner can read the group's head
            -- between this change and the commit.
            v_movable := true;
            -- (Distributed: a grouped job's part is its group's.)
            IF v_job.group_id IS NOT NULL THEN
                SELECT g.head_id INTO v_head FROM pgfifo.queue_group AS g
                WHERE g.queue = p_queue[v_i] AND g.group_id = v_job.group_id
                  /*@dist AND g.part = v_jpart */
                FOR NO KEY UPDATE SKIP LOCKED;
                IF NOT FOUND THEN
                    -- Locked by a runner, or missing (not promoted yet):
                    -- then promote creates it from a wake row, which this
                    -- holds back until the commit if it can lock one.
                    v_head := NULL;
                    v_movable := NOT EXISTS (SELECT 1 FROM pgfifo.queue_group AS g
                                             WHERE g.queue = p_queue[v_i] AND g.group_id = v_job.group_id
                                               /*@dist AND g.part = v_jpart */)
                                 AND EXISTS (SELECT 1 FROM pgfifo.group_wake AS k
                                             WHERE k.queue = p_queue[v_i] AND k.group_id = v_job.group_id
                                               /*@dist AND k.part = v_jpart */
                                             FOR UPDATE SKIP LOCKED);
                END IF;
            END IF;
            v_at := now() + v_period;
            -- (Distributed: the payload from a variable; Citus's server
            -- crashed on an update with an array's element, see complete.)
            /*@dist v_payload := p_payload[v_i]; */
            IF v_movable THEN
                UPDATE pgfifo.job
                SET payload = /*@plain*/ p_payload[v_i] /*@end*/ /*@dist v_payload */, run_after = v_at
                WHERE id = v_job.id /*@dist AND part = v_jpart */;
                UPDATE pgfifo.job_window AS w SET until = v_at
                WHERE w.queue = p_queue[v_i] AND w.key = v_key /*@dist AND w.part = v_wpart */;
                IF v_head = v_job.id THEN
                    UPDATE pgfifo.queue_group AS g SET ready_at = v_at
                    WHERE g.queue = p_queue[v_i] AND g.group_id = v_job.group_id AND g.ready_at IS NOT NULL
                      /*@dist AND g.part = v_jpart */;
                END IF;
            ELSE
                UPDATE pgfifo.job SET payload = /*@plain*/ p_payload[v_i] /*@end*/ /*@dist v_payload */
                WHERE id = v_job.id /*@dist AND part = v_jpart */;
            END IF;
            ids := ids || v_job.id;
            outcomes := outcomes || 'debounced'::text;
        ELSE
            -- A new job, through pgfifo.enqueue (one row: it takes exactly
            -- one id from the sequence, so the job is new if and only if
            -- its id is this session's last one).
            v_id := (pgfifo.enqueue(
                ARRAY[p_queue[v_i]], ARRAY[p_group[v_i]], ARRAY[p_kind[v_i]], ARRAY[p_payload[v_i]],
                ARRAY[p_priority[v_i]], ARRAY[p_max_attempts[v_i]], ARRAY[p_unique_key[v_i]],
                ARRAY[p_run_at_us[v_i]],
                ARRAY[CASE WHEN v_mode = 'debounce' THEN p_window_us[v_i] ELSE p_delay_us[v_i] END]))[1];
            ids := ids || v_id;
            IF v_id <> currval('pgfifo.job_id_seq') THEN
                outcomes := outcomes || 'deduplicated'::text;
                CONTINUE;
            END IF;
            outcomes := outcomes || 'created'::text;
            IF v_key IS NOT NULL THEN
                IF v_mode = 'unique' THEN
                    v_until := now() + v_period;
                ELSIF v_mode = 'throttle' THEN
                    -- The end of the period-aligned slot (from the Unix epoch).
                    v_slot := floor((extract(epoch FROM now()) * 1000000) / p_window_us[v_i]);
                    v_until := to_timestamp(((v_slot + 1) * p_window_us[v_i]) / 1000000.0);
                ELSE
                    v_until := now() + v_period;
                END IF;
                /*@dist v_jpart := pgfifo.job_part(p_queue[v_i], p_group[v_i], v_id, NULL); */
                INSERT INTO pgfifo.job_window AS w (queue, key, mode, job_id, period, until
                                                    /*@dist , part, job_part */)
                VALUES (p_queue[v_i], v_key, v_mode, v_id, v_period, v_until /*@dist , v_wpart, v_jpart */)
                ON CONFLICT (/*@dist part, */ queue, key) DO UPDATE
                SET mode = EXCLUDED.mode, job_id = EXCLUDED.job_id, period = EXCLUDED.period,
                    until = EXCLUDED.until /*@dist , job_part = EXCLUDED.job_part */;
            END IF;
        END IF;
    END LOOP;
END
$$;

-- Deletes window rows that hold nothing any more (at most p_limit): unique
-- and throttle windows that ended, debounce windows whose job has started
-- or finished. Returns how many. Called by retention.
CREATE OR REPLACE FUNCTION pgfifo.clean_windows(p_limit integer) RETURNS bigint
LANGUAGE plpgsql
/*@dist SET plan_cache_mode = force_custom_plan */
AS $$
DECLARE
    v_n bigint := 0;
    /*@dist
    v_cand record;
    v_part integer;
    v_rows bigint;
    v_seen integer;
    v_after record;
    */
BEGIN
    IF to_regclass('pgfifo.job_window') IS NULL THEN
        RETURN 0;
    END IF;
    /*@plain*/
    WITH victims AS (
        SELECT w.queue, w.key FROM pgfifo.job_window AS w
        WHERE CASE WHEN w.mode = 'debounce'
                   THEN NOT EXISTS (SELECT 1 FROM pgfifo.job AS j
                                    WHERE j.id = w.job_id AND j.state = 'queued'
                                      AND j.attempts = 0)
                   ELSE w.until <= now() END
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED),
    gone AS (
        DELETE FROM pgfifo.job_window AS w USING victims AS v
        WHERE w.queue = v.queue AND w.key = v.key
        RETURNING 1)
    SELECT count(*) INTO v_n FROM gone;
    /*@end*/
    /*@dist
    -- Distributed: a window and its job are on two parts. Candidates are
    -- the windows whose end has passed (a debounce window's end is its
    -- job's start: before it, the job cannot have started), read from
    -- every shard without locks, a page at a time in key order: a debounce
    -- window still holds while its job waits for a lane, and is passed.
    -- Each other is deleted by a statement that names its part, under FOR
    -- UPDATE SKIP LOCKED, if it still names the same job (an enqueue may
    -- have opened a new window on the key meanwhile).
    SELECT -1 AS part, ''::text AS queue, ''::text AS key INTO v_after;
    LOOP
        v_seen := 0;
        FOR v_cand IN
            SELECT w.part, w.queue, w.key, w.mode, w.job_id, w.job_part
            FROM pgfifo.job_window AS w
            WHERE w.until <= now() AND (w.part, w.queue, w.key) > (v_after.part, v_after.queue, v_after.key)
            ORDER BY w.part, w.queue, w.key
            LIMIT p_limit
        LOOP
            v_seen := v_seen + 1;
            v_after := v_cand;
            CONTINUE WHEN v_cand.mode = 'debounce'
                          AND EXISTS (SELECT 1 FROM pgfifo.job AS j
                                      WHERE j.part = v_cand.job_part AND j.id = v_cand.job_id
                                        AND j.state = 'queued' AND j.attempts = 0);
            v_part := v_cand.part;
            DELETE FROM pgfifo.job_window AS w
            WHERE w.part = v_part AND (w.queue, w.key) IN (
                SELECT x.queue, x.key FROM pgfifo.job_window AS x
                WHERE x.part = v_part AND x.queue = v_cand.queue AND x.key = v_cand.key
                  AND x.job_id = v_cand.job_id AND x.until <= now()
                FOR UPDATE SKIP LOCKED);
            GET DIAGNOSTICS v_rows = ROW_COUNT;
            v_n := v_n + v_rows;
            EXIT WHEN v_n >= p_limit;
        END LOOP;
        EXIT WHEN v_n >= p_limit OR v_seen < p_limit;
    END LOOP;
    */
    RETURN v_n;
END
$$;

-- The window job p_job carries, if any (none after `migrate down`): its
-- key, mode, period and end (for debounce: the job's start), and whether
-- it still holds its key. For `pgfifo job ID` and admin::job.
CREATE OR REPLACE FUNCTION pgfifo.window_of_job(p_job bigint)
RETURNS TABLE (key text, mode text, period_us bigint, until_us bigint, holds boolean)
LANGUAGE plpgsql STABLE
AS $$
/*@dist
DECLARE
    r record;
*/
BEGIN
    IF to_regclass('pgfifo.job_window') IS NULL THEN
        RETURN;
    END IF;
    /*@plain*/
    RETURN QUERY
    SELECT w.key::text, w.mode,
           (extract(epoch FROM w.period) * 1000000)::bigint,
           (extract(epoch FROM w.until) * 1000000)::bigint,
           CASE WHEN w.mode = 'debounce'
                THEN EXISTS (SELECT 1 FROM pgfifo.job AS j
                             WHERE j.id = w.job_id AND j.state = 'queued' AND j.attempts = 0)
                ELSE w.until > now() END
    FROM pgfifo.job_window AS w
    WHERE w.job_id = p_job
    LIMIT 1;
    /*@end*/
    /*@dist
    -- The window's row is on its key's part, the job on its group's: two
    -- reads, as Citus joins only rows of one part.
    FOR r IN SELECT w.key, w.mode, w.period, w.until, w.job_id, w.job_part
             FROM pgfifo.job_window AS w
             WHERE w.job_id = p_job LIMIT 1 LOOP
        key := r.key::text;
        mode := r.mode;
        period_us := (extract(epoch FROM r.period) * 1000000)::bigint;
        until_us := (extract(epoch FROM r.until) * 1000000)::bigint;
        holds := CASE WHEN r.mode = 'debounce'
                      THEN EXISTS (SELECT 1 FROM pgfifo.job AS j
                                   WHERE j.part = r.job_part AND j.id = r.job_id
                                     AND j.state = 'queued' AND j.attempts = 0)
                      ELSE r.until > now() END;
        RETURN NEXT;
    END LOOP;
    */
END
$$;

-- Queue limits: a whole queue's concurrency and token bucket (migration
-- 0011), on top of its groups' limits (15_controls.sql).
--
-- Installed whole by `migrate` (CREATE OR REPLACE) after the numbered
-- migrations; see crates/pgfifo/src/migrate.rs and docs/upgrading.md for
-- how a change of arguments or result type is made.
--
-- Where they act:
--   * concurrency: pgfifo.pick locks one of the queue's slot rows
--     (pgfifo.queue_slot, rows 0 .. N-1) FOR UPDATE SKIP LOCKED before it
--     takes any job of the queue, and the job transaction keeps it while
--     the lane runs the pick's jobs (one after another). No free slot: the
--     pick passes the queue by. A crash ends the transaction and frees it;
--   * rate: the pick passes a queue without a token by, and
--     pgfifo.start_attempts takes one token per start
--     (pgfifo.take_queue_tokens), before the groups' own tokens, in the
--     transaction that records the attempt; a start without one is refused;
--   * the functions of the hot path look for pgfifo.queue_control with
--     to_regclass (after `migrate down`, these tables are gone), then for
--     the queue's row: a queue without limits costs one index probe.
--
-- Distributed (Citus): pgfifo.queue_control, queue_slot and queue_bucket
-- stay plain tables of the coordinator, where pgfifo's functions run: a
-- pick holds a slot's row there for its job transaction, and a start
-- writes the bucket there, without a write to every node. No statement
-- joins them with a distributed table: the jobs are read apart, by part.

-- The second key of a queue slot's advisory lock (class 1885824625,
-- 'pgfq'): taken with the slot's row by the pick's transaction, and kept
-- at session level by a long run claimed in it (45_long_run.sql).
CREATE OR REPLACE FUNCTION pgfifo.queue_slot_key(p_queue text, p_slot integer)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT hashtext(p_queue || chr(31) || p_slot::text)
$$;

-- A queue's limits: NULL values are no limit; burst defaults to the rate's
-- count. No row: all NULL.
CREATE OR REPLACE FUNCTION pgfifo.queue_limits_of(
    p_queue            text,
    OUT concurrency    integer,
    OUT rate_count     integer,
    OUT rate_period_ms bigint,
    OUT burst          integer
)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    SELECT c.concurrency, c.rate_count, c.rate_period_ms, coalesce(c.burst, c.rate_count)
    INTO concurrency, rate_count, rate_period_ms, burst
    FROM pgfifo.queue_control AS c WHERE c.queue = p_queue;
END
$$;

-- The tokens in a queue's bucket at p_now (refilled since it was last
-- written, up to the burst; no row: a full bucket).
CREATE OR REPLACE FUNCTION pgfifo.queue_bucket_tokens(
    p_queue text, p_now timestamptz, p_rate_count integer, p_rate_period_ms bigint, p_burst integer
)
RETURNS double precision
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_tokens double precision;
BEGIN
    SELECT least(p_burst::double precision,
                 b.tokens + greatest(extract(epoch FROM p_now - b.at), 0)
                            * 1000.0 * p_rate_count / p_rate_period_ms)
    INTO v_tokens
    FROM pgfifo.queue_bucket AS b WHERE b.queue = p_queue;
    RETURN coalesce(v_tokens, p_burst::double precision);
END
$$;

-- When a queue with that rate may next start a job: p_now if its bucket
-- has a token, else when the next one is due (rounded up to the µs).
CREATE OR REPLACE FUNCTION pgfifo.queue_bucket_due(
    p_queue text, p_now timestamptz, p_rate_count integer, p_rate_period_ms bigint, p_burst integer
)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_tokens double precision := pgfifo.queue_bucket_tokens(p_queue, p_now, p_rate_count,
                                                            p_rate_period_ms, p_burst);
BEGIN
    IF v_tokens >= 1 - 1e-9 THEN
        RETURN p_now;
    END IF;
    RETURN p_now + ceil((1 - v_tokens) * p_rate_period_ms * 1000.0 / p_rate_count)
                   * interval '1 microsecond';
END
$$;

-- When a queue may next start a job by its own rate: p_now if it has a
-- token or no rate (or queue limits do not exist in this schema).
CREATE OR REPLACE FUNCTION pgfifo.queue_token_due(p_queue text, p_now timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    l record;
BEGIN
    SELECT * INTO l FROM pgfifo.queue_limits_of(p_queue);
    IF l.rate_count IS NULL THEN
        RETURN p_now;
    END IF;
    RETURN pgfifo.queue_bucket_due(p_queue, p_now, l.rate_count, l.rate_period_ms, l.burst);
END
$$;

-- Takes one token from the bucket of each rate-limited queue for each of
-- the jobs p_ids, at p_now. Called by start_attempts before the groups'
-- tokens. Returns the jobs that must not start: their queue had no token
-- left, or (in a group that runs several jobs at once) an older queued job
-- of their group has no attempt under way and would start after them.
-- The bucket row's lock orders concurrent takes of one queue (and is
-- taken before any group's bucket: one order for every caller).
-- (Distributed: p_parts holds the jobs' parts, as for take_start_tokens.)
CREATE OR REPLACE FUNCTION pgfifo.take_queue_tokens(p_ids bigint[], p_now timestamptz
                                                    /*@dist , p_parts integer[] */)
RETURNS bigint[]
LANGUAGE plpgsql
AS $$
DECLARE
    v_job     record;
    v_lim     record;
    v_q       text;
    v_tokens  double precision;
    v_refused bigint[] := '{}';
    v_conc    integer;
    /*@dist
    v_part    integer;
    v_rated   text[] := ARRAY(SELECT c.queue FROM pgfifo.queue_control AS c
                              WHERE c.rate_count IS NOT NULL);
    */
BEGIN
    FOR v_job IN
        /*@plain*/
        SELECT j.id, j.queue, j.group_id FROM pgfifo.job AS j
        JOIN pgfifo.queue_control AS c ON c.queue = j.queue AND c.rate_count IS NOT NULL
        WHERE j.id = ANY (p_ids)
        ORDER BY j.queue, j.group_id, j.id
        /*@end*/
        /*@dist
        SELECT j.id, j.queue, j.group_id, j.part FROM pgfifo.job AS j
        WHERE j.part = ANY (p_parts) AND j.id = ANY (p_ids) AND j.queue = ANY (v_rated)
        ORDER BY j.queue, j.group_id, j.id
        */
    LOOP
        /*@dist v_part := v_job.part; */
        IF v_q IS DISTINCT FROM v_job.queue THEN
            v_q := v_job.queue;
            SELECT * INTO v_lim FROM pgfifo.queue_limits_of(v_q);
            INSERT INTO pgfifo.queue_bucket (queue, tokens, at)
            VALUES (v_q, v_lim.burst, p_now)
            ON CONFLICT (queue) DO NOTHING;
            PERFORM 1 FROM pgfifo.queue_bucket AS b WHERE b.queue = v_q FOR UPDATE;
        END IF;
        IF v_job.group_id IS NOT NULL THEN
            v_conc := 1;
            IF EXISTS (SELECT 1 FROM pgfifo.group_control AS c WHERE c.queue = v_q) THEN
                SELECT l.concurrency INTO v_conc FROM pgfifo.group_limits(v_q, v_job.group_id) AS l;
            END IF;
            IF v_conc > 1 AND EXISTS (
                   SELECT 1 FROM pgfifo.job AS k
                   WHERE k.queue = v_q AND k.group_id = v_job.group_id
                     AND k.state = 'queued' AND k.id < v_job.id /*@dist AND k.part = v_part */
                     AND NOT (k.id = ANY (p_ids) AND k.id <> ALL (v_refused))
                     AND NOT EXISTS (SELECT 1 FROM pgfifo.job_attempt AS a
                                     WHERE a.job_id = k.id AND a.finished_at IS NULL
                                       /*@dist AND a.part = v_part */)) THEN
                v_refused := v_refused || v_job.id;
                CONTINUE;
            END IF;
        END IF;
        v_tokens := pgfifo.queue_bucket_tokens(v_q, p_now, v_lim.rate_count, v_lim.rate_period_ms,
                                               v_lim.burst);
        IF v_tokens < 1 - 1e-9 THEN
            v_refused := v_refused || v_job.id;
            CONTINUE;
        END IF;
        -- (The bucket's time never goes back: see take_start_tokens.)
        UPDATE pgfifo.queue_bucket AS b SET tokens = v_tokens - 1, at = greatest(b.at, p_now)
        WHERE b.queue = v_q;
    END LOOP;
    RETURN v_refused;
END
$$;

-- Gives back the queue tokens of the jobs p_ids (one each, in
-- rate-limited queues): starts refused by their groups after their
-- queue's token was taken, or handed back unstarted.
CREATE OR REPLACE FUNCTION pgfifo.give_back_queue_tokens(p_ids bigint[], p_now timestamptz)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_q      record;
    v_tokens double precision;
    /*@dist v_queues text[] := ARRAY(SELECT j.queue FROM pgfifo.job AS j WHERE j.id = ANY (p_ids)); */
BEGIN
    FOR v_q IN
        /*@plain*/
        SELECT j.queue, count(*) AS n, l.rate_count, l.rate_period_ms, l.burst
        FROM pgfifo.job AS j
        CROSS JOIN LATERAL pgfifo.queue_limits_of(j.queue) AS l
        WHERE j.id = ANY (p_ids) AND l.rate_count IS NOT NULL
        GROUP BY j.queue, l.rate_count, l.rate_period_ms, l.burst
        ORDER BY j.queue
        /*@end*/
        -- (Distributed: the jobs' queues read first, from every shard; the
        -- limits, on the coordinator, apart.)
        /*@dist
        SELECT q.queue, q.n, l.rate_count, l.rate_period_ms, l.burst
        FROM (SELECT x.queue, count(*) AS n FROM unnest(v_queues) AS x(queue)
              GROUP BY x.queue) AS q
        CROSS JOIN LATERAL pgfifo.queue_limits_of(q.queue) AS l
        WHERE l.rate_count IS NOT NULL
        ORDER BY q.queue
        */
    LOOP
        PERFORM 1 FROM pgfifo.queue_bucket AS b WHERE b.queue = v_q.queue FOR UPDATE;
        v_tokens := pgfifo.queue_bucket_tokens(v_q.queue, p_now, v_q.rate_count, v_q.rate_period_ms,
                                               v_q.burst);
        UPDATE pgfifo.queue_bucket AS b
        SET tokens = least(v_tokens + v_q.n, v_q.burst), at = greatest(b.at, p_now)
        WHERE b.queue = v_q.queue;
    END LOOP;
END
$$;

-- Changes some of a queue's limits and keeps the others: p_change names
-- those that change ('concurrency', 'rate', 'burst'), to the values given
-- (NULL: unset). A row left with nothing set is deleted (no limits).
-- Creates the slots a higher concurrency needs, cuts a bucket fuller than a
-- new burst, and wakes the queue's runners. Bad values are refused with
-- invalid_parameter_value and nothing is written. Returns the limits as
-- they are now (no row when none are left).
CREATE OR REPLACE FUNCTION pgfifo.change_queue_control(
    p_queue          text,
    p_change         text[],
    p_concurrency    integer,
    p_rate_count     integer,
    p_rate_period_ms bigint,
    p_burst          integer
)
RETURNS TABLE (concurrency integer, rate_count integer, rate_period_ms bigint, burst integer)
LANGUAGE plpgsql
AS $$
DECLARE
    v_rate boolean := 'rate' = ANY (p_change);
    v_conc boolean := 'concurrency' = ANY (p_change);
    v_burst boolean := 'burst' = ANY (p_change);
    v_row  pgfifo.queue_control;
    v_bad  text;
BEGIN
    IF p_queue IS NULL OR p_queue = '' THEN
        RAISE EXCEPTION 'pgfifo change_queue_control: the queue name is empty'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT c INTO v_bad FROM unnest(p_change) AS c
    WHERE c IS NULL OR c NOT IN ('concurrency', 'rate', 'burst') LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'pgfifo change_queue_control: % is not a queue limit (concurrency, rate, burst)',
            coalesce(v_bad, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_conc AND p_concurrency IS NOT NULL AND p_concurrency NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'pgfifo change_queue_control: concurrency must be between 1 and 10000 (to stop a queue, pause it), not %',
            p_concurrency
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_rate AND (p_rate_count IS NULL) <> (p_rate_period_ms IS NULL) THEN
        RAISE EXCEPTION 'pgfifo change_queue_control: rate needs both a count and a period'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_rate AND p_rate_count IS NOT NULL AND p_rate_count NOT BETWEEN 1 AND 1000000 THEN
        RAISE EXCEPTION 'pgfifo change_queue_control: rate must allow between 1 and 1000000 starts per period (to stop a queue, pause it), not %',
            p_rate_count
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_rate AND p_rate_period_ms IS NOT NULL AND p_rate_period_ms NOT BETWEEN 1 AND 31622400000 THEN
        RAISE EXCEPTION 'pgfifo change_queue_control: the rate''s period must be between 1 ms and 366 days, not % ms',
            p_rate_period_ms
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_burst AND p_burst IS NOT NULL AND p_burst NOT BETWEEN 1 AND 1000000 THEN
        RAISE EXCEPTION 'pgfifo change_queue_control: burst must be between 1 and 1000000, not %', p_burst
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO pgfifo.queue_control AS c (queue, concurrency, rate_count, rate_period_ms, burst)
    VALUES (p_queue,
            CASE WHEN v_conc THEN p_concurrency END,
            CASE WHEN v_rate THEN p_rate_count END,
            CASE WHEN v_rate THEN p_rate_period_ms END,
            CASE WHEN v_burst THEN p_burst END)
    ON CONFLICT ON CONSTRAINT queue_control_pkey DO UPDATE
    SET concurrency = CASE WHEN v_conc THEN excluded.concurrency ELSE c.concurrency END,
        rate_count = CASE WHEN v_rate THEN excluded.rate_count ELSE c.rate_count END,
        rate_period_ms = CASE WHEN v_rate THEN excluded.rate_period_ms ELSE c.rate_period_ms END,
        burst = CASE WHEN v_burst THEN excluded.burst ELSE c.burst END,
        updated_at = now()
    RETURNING c.* INTO v_row;
    IF v_row.burst IS NOT NULL AND v_row.rate_count IS NULL THEN
        RAISE EXCEPTION 'pgfifo change_queue_control: a burst needs a rate'
            USING ERRCODE = 'invalid_parameter_value', CONSTRAINT = 'pgfifo_queue_burst_needs_rate';
    END IF;
    IF num_nulls(v_row.concurrency, v_row.rate_count, v_row.burst) = 3 THEN
        DELETE FROM pgfifo.queue_control AS c WHERE c.queue = p_queue;
        DELETE FROM pgfifo.queue_bucket AS b WHERE b.queue = p_queue;
    ELSE
        concurrency := v_row.concurrency;
        rate_count := v_row.rate_count;
        rate_period_ms := v_row.rate_period_ms;
        burst := v_row.burst;
        RETURN NEXT;
        IF v_row.concurrency IS NOT NULL THEN
            -- Rows that exist (perhaps locked by running jobs) are left
            -- alone: never waits.
            INSERT INTO pgfifo.queue_slot (queue, slot)
            SELECT p_queue, s.n FROM generate_series(0, v_row.concurrency - 1) AS s(n)
            WHERE NOT EXISTS (SELECT 1 FROM pgfifo.queue_slot AS x
                              WHERE x.queue = p_queue AND x.slot = s.n)
            ON CONFLICT DO NOTHING;
        END IF;
        UPDATE pgfifo.queue_bucket AS b SET tokens = coalesce(v_row.burst, v_row.rate_count)
        WHERE b.queue = p_queue AND b.tokens > coalesce(v_row.burst, v_row.rate_count);
    END IF;
    -- Runners waiting for a slot or a token of this queue look again.
    PERFORM pg_notify('pgfifo_groups', p_queue);
END
$$;

-- Distributed: the runner's queue-token watch (db/queue_rate.rs runs one
-- statement on a plain database): of p_queues, those with a rate and not
-- paused, each with its bucket and whether it has a group whose head may
-- start by its time or an ungrouped job that may start now. The limits and
-- buckets are read on the coordinator; the work, per queue, with one read
-- of every shard, which stops at the first ready row.
/*@dist
CREATE OR REPLACE FUNCTION pgfifo.rate_limited_queues(p_queues text[])
RETURNS TABLE (queue text, tokens double precision, per_second double precision,
               burst integer, ready boolean)
LANGUAGE plpgsql
AS $$
DECLARE
    v_now    timestamptz := now();
    v_paused text[] := ARRAY(SELECT s.queue FROM pgfifo.queue_setting AS s
                             WHERE s.queue = ANY (p_queues) AND s.paused);
    c        record;
BEGIN
    FOR c IN
        SELECT l.queue, l.rate_count, l.rate_period_ms, coalesce(l.burst, l.rate_count) AS burst
        FROM pgfifo.queue_control AS l
        WHERE l.queue = ANY (p_queues) AND l.rate_count IS NOT NULL AND l.queue <> ALL (v_paused)
        ORDER BY l.queue
    LOOP
        queue := c.queue;
        tokens := pgfifo.queue_bucket_tokens(c.queue, v_now, c.rate_count, c.rate_period_ms, c.burst);
        per_second := c.rate_count * 1000.0::float8 / c.rate_period_ms;
        burst := c.burst;
        ready := EXISTS (SELECT 1 FROM pgfifo.queue_group AS g
                         WHERE g.queue = c.queue AND g.ready_at IS NOT NULL AND g.ready_at <= v_now)
                 OR EXISTS (SELECT 1 FROM pgfifo.job AS j
                            WHERE j.queue = c.queue AND j.state = 'queued' AND j.group_id IS NULL
                              AND j.run_after <= v_now);
        RETURN NEXT;
    END LOOP;
END
$$;
*/

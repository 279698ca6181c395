-- Group controls: rate limits (token buckets) and the settings behind them.
--
-- Installed whole by `migrate` (CREATE OR REPLACE) after the numbered
-- migrations; see crates/pgfifo/src/migrate.rs and docs/upgrading.md for
-- how a change of arguments or result type is made.
--
-- Where a rate limit acts (see migration 0006 for the tables):
--   * a start takes a token: pgfifo.take_start_tokens, from start_attempts,
--     in the transaction that records the attempt, before the handler runs;
--     a start without a token is refused (it never runs its handler);
--   * a group with no token left waits: complete (after its head advanced),
--     promote (when it becomes active) and pick (a safety net for settings
--     changed meanwhile) set its ready_at to when its next token is due, so
--     no pick looks at it before then, and report that time to the runner;
--   * the functions of the hot path (complete, promote, pick,
--     start_attempts) look for pgfifo.group_control with to_regclass before
--     they touch it or call the functions here: after `migrate down` to a
--     schema without it, they keep working for the previous release;
--   * the take locks the group's bucket row, so takes of one group (with a
--     concurrency above 1, several runners may start its jobs at once) are
--     one after another, and each sees the tokens the one before it left.

-- The limits that apply to a group: its own row's values, else its queue's
-- defaults (the row whose group_id is ''). rate_count is NULL when the group
-- has no rate limit; burst defaults to rate_count, concurrency and weight to
-- 1. (PL/pgSQL, whose plan each session keeps: an SQL function of this
-- shape is planned again on every call, about 30 µs.)
CREATE OR REPLACE FUNCTION pgfifo.group_limits(
    p_queue            text,
    p_group            text,
    OUT rate_count     integer,
    OUT rate_period_ms bigint,
    OUT burst          integer,
    OUT concurrency    integer,
    OUT weight         integer
)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    -- (Distributed: pgfifo.group_control is a table of the coordinator,
    -- where this runs.)
    SELECT coalesce(g.rate_count, d.rate_count),
           CASE WHEN g.rate_count IS NOT NULL THEN g.rate_period_ms ELSE d.rate_period_ms END,
           coalesce(g.burst, d.burst, g.rate_count, d.rate_count),
           coalesce(g.concurrency, d.concurrency, 1),
           coalesce(g.weight, d.weight, 1)
    INTO rate_count, rate_period_ms, burst, concurrency, weight
    FROM (SELECT) AS one
    LEFT JOIN pgfifo.group_control AS d ON d.queue = p_queue AND d.group_id = ''
    LEFT JOIN pgfifo.group_control AS g ON g.queue = p_queue AND g.group_id = p_group;
END
$$;

-- The tokens in a group's bucket at p_now, for a rate limit of
-- p_rate_count per p_rate_period_ms with a burst of p_burst: refilled since
-- the bucket was last written, up to the burst; a group without a bucket
-- row has a full one.
CREATE OR REPLACE FUNCTION pgfifo.bucket_tokens(
    p_queue text, p_group text, p_now timestamptz,
    p_rate_count integer, p_rate_period_ms bigint, p_burst integer
)
RETURNS double precision
-- (Distributed: PL/pgSQL, since Citus does not plan an SQL function's
-- statements with parameters, with the bucket's part in a variable.)
LANGUAGE /*@plain*/ sql /*@end*/ /*@dist plpgsql */ STABLE
AS $$
    /*@dist DECLARE v_part integer := pgfifo.part_of(p_queue, p_group); BEGIN */
    /*@plain*/ SELECT /*@end*/ /*@dist RETURN */ coalesce(
        (SELECT least(p_burst::double precision,
                      b.tokens + greatest(extract(epoch FROM p_now - b.at), 0)
                                 * 1000.0 * p_rate_count / p_rate_period_ms)
         FROM pgfifo.group_bucket AS b
         WHERE b.queue = p_queue AND b.group_id = p_group /*@dist AND b.part = v_part */),
        p_burst::double precision)
    /*@dist ; END */
$$;

-- When a group with that rate limit may next start a job: p_now if its
-- bucket has a token, else the moment its next token is due. (A token due
-- within a microsecond counts: the time is rounded up to whole
-- microseconds.)
CREATE OR REPLACE FUNCTION pgfifo.bucket_due(
    p_queue text, p_group text, p_now timestamptz,
    p_rate_count integer, p_rate_period_ms bigint, p_burst integer
)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_tokens double precision := pgfifo.bucket_tokens(p_queue, p_group, p_now, p_rate_count,
                                                      p_rate_period_ms, p_burst);
BEGIN
    IF v_tokens >= 1 - 1e-9 THEN
        RETURN p_now;
    END IF;
    RETURN p_now + ceil((1 - v_tokens) * p_rate_period_ms * 1000.0 / p_rate_count)
                   * interval '1 microsecond';
END
$$;

-- A group's tokens at p_now by its limits; NULL without a rate limit.
CREATE OR REPLACE FUNCTION pgfifo.group_tokens(p_queue text, p_group text, p_now timestamptz)
RETURNS double precision
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    l record;
BEGIN
    SELECT * INTO l FROM pgfifo.group_limits(p_queue, p_group);
    IF l.rate_count IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN pgfifo.bucket_tokens(p_queue, p_group, p_now, l.rate_count, l.rate_period_ms, l.burst);
END
$$;

-- When a group may next start a job as far as its rate limit goes: p_now if
-- it has a token (or no limit), else the moment its next token is due.
CREATE OR REPLACE FUNCTION pgfifo.token_due(p_queue text, p_group text, p_now timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    l record;
BEGIN
    SELECT * INTO l FROM pgfifo.group_limits(p_queue, p_group);
    IF l.rate_count IS NULL THEN
        RETURN p_now;
    END IF;
    RETURN pgfifo.bucket_due(p_queue, p_group, p_now, l.rate_count, l.rate_period_ms, l.burst);
END
$$;

-- Takes one token from the bucket of each rate-limited group of the jobs
-- p_ids, starting at p_now. Called by start_attempts, in its transaction,
-- with the time it records as the attempts' start. Returns the jobs whose
-- group had no token left: they must not start. (That happens when several
-- jobs of a group with concurrency above 1 were picked for one token, or
-- when the limits changed since the pick looked.) The bucket row's lock
-- orders concurrent takes of one group. (Distributed: p_parts holds the
-- jobs' parts, so that the read of the jobs goes to their shards only;
-- each group's statements name its part.)
CREATE OR REPLACE FUNCTION pgfifo.take_start_tokens(p_ids bigint[], p_now timestamptz
                                                    /*@dist , p_parts integer[] */)
RETURNS bigint[]
LANGUAGE plpgsql
AS $$
DECLARE
    /*@dist
    v_part integer;
    v_cq   text[] := ARRAY(SELECT DISTINCT c.queue FROM pgfifo.group_control AS c);
    */
    v_job     record;
    v_now     timestamptz := p_now;
    v_tokens  double precision;
    v_refused bigint[] := '{}';
    v_rate    record;
    v_wq      text;
    v_weighted boolean := false;
BEGIN
    FOR v_job IN
        SELECT j.id, j.queue, j.group_id /*@dist , j.part */ FROM pgfifo.job AS j
        WHERE j.id = ANY (p_ids) AND j.group_id IS NOT NULL
          /*@plain*/
          AND EXISTS (SELECT 1 FROM pgfifo.group_control AS c WHERE c.queue = j.queue)
          /*@end*/
          -- (Distributed: the queues with limits read first, on the
          -- coordinator, where the limits are.)
          /*@dist
          AND j.queue = ANY (v_cq) AND j.part = ANY (p_parts)
          */
        -- (Buckets and shares are locked in one order by every caller: no
        -- deadlock.)
        ORDER BY j.queue, j.group_id, j.id
    LOOP
        /*@dist v_part := v_job.part; */
        SELECT * INTO v_rate FROM pgfifo.group_limits(v_job.queue, v_job.group_id);
        -- A start in a queue with weights counts towards its group's share.
        IF v_wq IS DISTINCT FROM v_job.queue THEN
            v_wq := v_job.queue;
            -- (In branches: after `migrate down`, the shares' functions
            -- are gone.)
            v_weighted := false;
            IF to_regclass('pgfifo.group_share') IS NOT NULL THEN
                v_weighted := pgfifo.queue_weighted(v_wq);
            END IF;
        END IF;
        IF v_rate.rate_count IS NULL THEN
            IF v_weighted THEN
                PERFORM pgfifo.charge_share(v_job.queue, v_job.group_id, v_rate.weight, 1);
            END IF;
            CONTINUE;
        END IF;
        -- Lock the bucket first, so that the tokens read next are the
        -- newest. A group without one gets a full one now: two first takes
        -- must not both count from a full bucket.
        INSERT INTO pgfifo.group_bucket AS b (queue, group_id, tokens, at /*@dist , part */)
        VALUES (v_job.queue, v_job.group_id, v_rate.burst, v_now /*@dist , v_part */)
        ON CONFLICT (/*@dist part, */ queue, group_id) DO NOTHING;
        PERFORM 1 FROM pgfifo.group_bucket AS b
        WHERE b.queue = v_job.queue AND b.group_id = v_job.group_id /*@dist AND b.part = v_part */
        FOR UPDATE;
        v_tokens := pgfifo.bucket_tokens(v_job.queue, v_job.group_id, v_now, v_rate.rate_count,
                                         v_rate.rate_period_ms, v_rate.burst);
        -- With a concurrency above 1, tokens go in FIFO order: a job does not
        -- take one while an older queued job of its group has no attempt
        -- under way (picked by another lane whose take comes next, or handed
        -- back): that job would start after it. Refused, it is handed back
        -- and picked again after the older one.
        IF v_rate.concurrency > 1 AND EXISTS (
               SELECT 1 FROM pgfifo.job AS k
               WHERE k.queue = v_job.queue AND k.group_id = v_job.group_id
                 AND k.state = 'queued' AND k.id < v_job.id /*@dist AND k.part = v_part */
                 AND NOT (k.id = ANY (p_ids) AND k.id <> ALL (v_refused))
                 AND NOT EXISTS (SELECT 1 FROM pgfifo.job_attempt AS a
                                 WHERE a.job_id = k.id AND a.finished_at IS NULL
                                   /*@dist AND a.part = v_part */)) THEN
            v_refused := v_refused || v_job.id;
            CONTINUE;
        END IF;
        IF v_tokens < 1 - 1e-9 THEN
            v_refused := v_refused || v_job.id;
            CONTINUE;
        END IF;
        -- (A take that waited for the bucket's lock may read an older
        -- clock than the take before it wrote: the bucket's time never goes
        -- back, or the refill since would be counted twice.)
        INSERT INTO pgfifo.group_bucket AS b (queue, group_id, tokens, at /*@dist , part */)
        VALUES (v_job.queue, v_job.group_id, v_tokens - 1, v_now /*@dist , v_part */)
        ON CONFLICT (/*@dist part, */ queue, group_id) DO UPDATE
        SET tokens = excluded.tokens, at = greatest(b.at, excluded.at);
        IF v_weighted THEN
            PERFORM pgfifo.charge_share(v_job.queue, v_job.group_id, v_rate.weight, 1);
        END IF;
    END LOOP;
    RETURN v_refused;
END
$$;

-- Gives back the tokens of starts that never ran their handler (jobs
-- handed back unstarted) and deletes their attempt records: (p_ids[i],
-- p_attempts[i]). Called by the runner on its bookkeeping connection, in
-- its own transaction.
CREATE OR REPLACE FUNCTION pgfifo.forget_attempts(p_ids bigint[], p_attempts integer[])
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    v_job    record;
    v_now    timestamptz := clock_timestamp();
    v_tokens double precision;
    v_rate   record;
    v_n      integer := 0;
    v_wq     text;
    v_weighted boolean := false;
    /*@dist v_part integer; */
BEGIN
    -- Queue tokens first (the order in which start_attempts locks buckets).
    -- (In a branch: after `migrate down`, queue limits are gone.)
    IF to_regclass('pgfifo.queue_control') IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM pgfifo.queue_control AS c WHERE c.rate_count IS NOT NULL) THEN
            PERFORM pgfifo.give_back_queue_tokens(
                ARRAY(SELECT a.job_id FROM pgfifo.job_attempt AS a
                      JOIN unnest(p_ids, p_attempts) AS t(job_id, attempt)
                        ON a.job_id = t.job_id AND a.attempt = t.attempt), v_now);
        END IF;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pgfifo.group_control) THEN
        DELETE FROM pgfifo.job_attempt AS a
        USING unnest(p_ids, p_attempts) AS t(job_id, attempt)
        WHERE a.job_id = t.job_id AND a.attempt = t.attempt;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        RETURN v_n;
    END IF;
    FOR v_job IN
        WITH gone AS (
            DELETE FROM pgfifo.job_attempt AS a
            USING unnest(p_ids, p_attempts) AS t(job_id, attempt)
            WHERE a.job_id = t.job_id AND a.attempt = t.attempt
            RETURNING a.job_id /*@dist , a.part */)
        SELECT j.queue, j.group_id /*@dist , j.part */
        FROM gone JOIN pgfifo.job AS j ON j.id = gone.job_id /*@dist AND j.part = gone.part */
        ORDER BY j.queue, j.group_id, j.id
    LOOP
        v_n := v_n + 1;
        CONTINUE WHEN v_job.group_id IS NULL;
        /*@dist v_part := v_job.part; */
        SELECT * INTO v_rate FROM pgfifo.group_limits(v_job.queue, v_job.group_id);
        IF v_wq IS DISTINCT FROM v_job.queue THEN
            v_wq := v_job.queue;
            -- (In branches: after `migrate down`, the shares' functions
            -- are gone.)
            v_weighted := false;
            IF to_regclass('pgfifo.group_share') IS NOT NULL THEN
                v_weighted := pgfifo.queue_weighted(v_wq);
            END IF;
        END IF;
        IF v_weighted THEN
            PERFORM pgfifo.charge_share(v_job.queue, v_job.group_id, v_rate.weight, -1);
        END IF;
        CONTINUE WHEN v_rate.rate_count IS NULL;
        PERFORM 1 FROM pgfifo.group_bucket AS b
        WHERE b.queue = v_job.queue AND b.group_id = v_job.group_id /*@dist AND b.part = v_part */
        FOR UPDATE;
        v_tokens := pgfifo.bucket_tokens(v_job.queue, v_job.group_id, v_now, v_rate.rate_count,
                                         v_rate.rate_period_ms, v_rate.burst);
        UPDATE pgfifo.group_bucket AS b
        SET tokens = least(v_tokens + 1, v_rate.burst), at = greatest(b.at, v_now)
        WHERE b.queue = v_job.queue AND b.group_id = v_job.group_id /*@dist AND b.part = v_part */;
    END LOOP;
    RETURN v_n;
END
$$;

-- In how many microseconds the group's next token is due (0: it has one,
-- or no rate limit), its queue's token included.
CREATE OR REPLACE FUNCTION pgfifo.next_token_in(p_queue text, p_group text) RETURNS bigint
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_due timestamptz := pgfifo.token_due(p_queue, p_group, v_now);
BEGIN
    -- The queue's own rate too, where queue limits exist (a branch: after
    -- `migrate down` they are gone; 16_queue_limits.sql).
    IF to_regclass('pgfifo.queue_control') IS NOT NULL THEN
        v_due := greatest(v_due, pgfifo.queue_token_due(p_queue, v_now));
    END IF;
    RETURN pgfifo.micros_until(v_due, v_now);
END
$$;

-- Creates the slot rows 0 .. p_n - 1 of a group that are missing. Never
-- waits: rows that exist (locked by running jobs or not) are left alone.
/*@plain*/
CREATE OR REPLACE FUNCTION pgfifo.ensure_slots(p_queue text, p_group text, p_n integer)
RETURNS void
LANGUAGE sql
BEGIN ATOMIC
    INSERT INTO pgfifo.group_slot (queue, group_id, slot)
    SELECT p_queue, p_group, s.n::smallint FROM generate_series(0, least(p_n, 1000) - 1) AS s(n)
    WHERE NOT EXISTS (SELECT 1 FROM pgfifo.group_slot AS x
                      WHERE x.queue = p_queue AND x.group_id = p_group AND x.slot = s.n)
    ON CONFLICT DO NOTHING;
END;
/*@end*/
-- Distributed: PL/pgSQL with the group's part in a variable (Citus does not
-- plan an SQL function's statements with parameters). The group's slots
-- are counted first, on its shard; only a group short of some is sent the
-- insert, whose rows Citus builds on the coordinator and routes.
/*@dist
CREATE OR REPLACE FUNCTION pgfifo.ensure_slots(p_queue text, p_group text, p_n integer)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_part integer := pgfifo.part_of(p_queue, p_group);
    v_n    integer := least(p_n, 1000);
BEGIN
    IF (SELECT count(*) FROM pgfifo.group_slot AS x
        WHERE x.part = v_part AND x.queue = p_queue AND x.group_id = p_group
          AND x.slot < v_n) >= v_n THEN
        RETURN;
    END IF;
    INSERT INTO pgfifo.group_slot (queue, group_id, slot, part)
    SELECT p_queue, p_group, s.n::smallint, v_part FROM generate_series(0, v_n - 1) AS s(n)
    ON CONFLICT DO NOTHING;
END
$$;
*/

-- Refuses a group's limits that no group could have: an empty group name
-- (NULL names the queue's defaults), a rate without both its count and
-- its period, a rate of no start at all.
CREATE OR REPLACE FUNCTION pgfifo.check_group_control(
    p_group          text,
    p_rate_count     integer,
    p_rate_period_ms bigint
)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_group = '' THEN
        RAISE EXCEPTION 'pgfifo set_group_control: the group name is empty (NULL sets the queue''s defaults)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (p_rate_count IS NULL) <> (p_rate_period_ms IS NULL) THEN
        RAISE EXCEPTION 'pgfifo set_group_control: rate needs both a count and a period'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_rate_count IS NOT NULL AND p_rate_count < 1 THEN
        RAISE EXCEPTION 'pgfifo set_group_control: rate must allow at least 1 start per period (to stop a group, pause it)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$$;

-- What a change of limits (of group p_group, or with NULL of the queue's
-- defaults) does to the groups it concerns: slots for those that may now
-- run more than one job at once, buckets fuller than the new burst cut to
-- it, and waiting groups woken, so that promote sets their next start by
-- the new limits (a running job keeps its group row; its completion
-- applies them).
CREATE OR REPLACE FUNCTION pgfifo.apply_group_control(p_queue text, p_group text)
RETURNS void
LANGUAGE plpgsql
AS $$
/*@dist
DECLARE
    v_now  timestamptz := now();
    v_d    record;
    v_own  record;
    v_lim  record;
    v_part integer;
    -- The groups with limits of their own (p_group's, or the queue's):
    -- those whose concurrency or burst is not the defaults'.
    v_conc text[];
    v_burst text[];
*/
BEGIN
    /*@plain*/
    PERFORM pgfifo.ensure_slots(g.queue, g.group_id, l.concurrency)
    FROM pgfifo.queue_group AS g
    CROSS JOIN LATERAL pgfifo.group_limits(g.queue, g.group_id) AS l
    WHERE g.queue = p_queue AND (p_group IS NULL OR g.group_id = p_group)
      AND l.concurrency > 1;
    UPDATE pgfifo.group_bucket AS b SET tokens = r.burst
    FROM pgfifo.group_bucket AS o
    CROSS JOIN LATERAL pgfifo.group_limits(o.queue, o.group_id) AS r
    WHERE b.queue = o.queue AND b.group_id = o.group_id
      AND o.queue = p_queue AND (p_group IS NULL OR o.group_id = p_group)
      AND r.burst IS NOT NULL AND o.tokens > r.burst;
    INSERT INTO pgfifo.group_wake (queue, group_id)
    SELECT g.queue, g.group_id FROM pgfifo.queue_group AS g
    WHERE g.queue = p_queue AND (p_group IS NULL OR g.group_id = p_group)
      AND g.ready_at > now();
    /*@end*/
    -- Distributed: the limits are a table of the coordinator, which Citus
    -- does not join with the groups' shards. The groups that take the
    -- queue's defaults are handled by statements run on every shard at
    -- once, with the defaults as values; each group with limits of its own
    -- (few: an operator sets them one by one) by statements on its shard.
    /*@dist
    SELECT d.concurrency, coalesce(d.burst, d.rate_count) AS burst INTO v_d
    FROM (SELECT) AS one
    LEFT JOIN pgfifo.group_control AS d ON d.queue = p_queue AND d.group_id = '';
    v_conc := ARRAY(SELECT c.group_id FROM pgfifo.group_control AS c
                    WHERE c.queue = p_queue AND c.group_id <> '' AND c.concurrency IS NOT NULL
                      AND (p_group IS NULL OR c.group_id = p_group));
    v_burst := ARRAY(SELECT c.group_id FROM pgfifo.group_control AS c
                     WHERE c.queue = p_queue AND c.group_id <> ''
                       AND (c.burst IS NOT NULL OR c.rate_count IS NOT NULL)
                       AND (p_group IS NULL OR c.group_id = p_group));
    IF v_d.concurrency > 1 THEN
        INSERT INTO pgfifo.group_slot (queue, group_id, slot, part)
        SELECT g.queue, g.group_id, s.n::smallint, g.part
        FROM pgfifo.queue_group AS g
        CROSS JOIN generate_series(0, least(v_d.concurrency, 1000) - 1) AS s(n)
        WHERE g.queue = p_queue AND (p_group IS NULL OR g.group_id = p_group)
          AND g.group_id <> ALL (v_conc)
        ON CONFLICT DO NOTHING;
    END IF;
    IF v_d.burst IS NOT NULL THEN
        UPDATE pgfifo.group_bucket AS b SET tokens = v_d.burst
        WHERE b.queue = p_queue AND (p_group IS NULL OR b.group_id = p_group)
          AND b.group_id <> ALL (v_burst) AND b.tokens > v_d.burst;
    END IF;
    FOR v_own IN
        SELECT c.group_id FROM pgfifo.group_control AS c
        WHERE c.queue = p_queue AND c.group_id <> '' AND (p_group IS NULL OR c.group_id = p_group)
        ORDER BY c.group_id
    LOOP
        v_part := pgfifo.part_of(p_queue, v_own.group_id);
        SELECT * INTO v_lim FROM pgfifo.group_limits(p_queue, v_own.group_id);
        IF v_lim.concurrency > 1
           AND EXISTS (SELECT 1 FROM pgfifo.queue_group AS g
                       WHERE g.part = v_part AND g.queue = p_queue AND g.group_id = v_own.group_id) THEN
            PERFORM pgfifo.ensure_slots(p_queue, v_own.group_id, v_lim.concurrency);
        END IF;
        IF v_own.group_id = ANY (v_burst) AND v_lim.burst IS NOT NULL THEN
            UPDATE pgfifo.group_bucket AS b SET tokens = v_lim.burst
            WHERE b.part = v_part AND b.queue = p_queue AND b.group_id = v_own.group_id
              AND b.tokens > v_lim.burst;
        END IF;
    END LOOP;
    INSERT INTO pgfifo.group_wake (queue, group_id, part)
    SELECT g.queue, g.group_id, g.part FROM pgfifo.queue_group AS g
    WHERE g.queue = p_queue AND (p_group IS NULL OR g.group_id = p_group)
      AND g.ready_at > v_now;
    */
    IF FOUND THEN
        PERFORM pg_notify('pgfifo_groups', p_queue);
    END IF;
END
$$;

-- Sets a group's limits (p_group NULL: the queue's defaults for all its
-- groups), replacing what was set there before. NULL values inherit (from
-- the queue's defaults) or, for the defaults, mean no limit. With
-- p_reset, the row is deleted instead: the group goes back to its queue's
-- defaults, or the queue to no limits. Returns whether a row was there
-- before.
CREATE OR REPLACE FUNCTION pgfifo.set_group_control(
    p_queue          text,
    p_group          text,
    p_rate_count     integer,
    p_rate_period_ms bigint,
    p_burst          integer,
    p_concurrency    integer DEFAULT NULL,
    p_weight         integer DEFAULT NULL,
    p_reset          boolean DEFAULT false
)
RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    v_key   text := coalesce(p_group, '');
    v_found boolean;
BEGIN
    /*@dist
    IF p_weight > 1 THEN
        PERFORM pgfifo.not_distributed('weights (group controls)');
    END IF;
    */
    PERFORM pgfifo.check_group_control(p_group, p_rate_count, p_rate_period_ms);
    SELECT true INTO v_found FROM pgfifo.group_control AS c
    WHERE c.queue = p_queue AND c.group_id = v_key FOR UPDATE;
    IF p_reset THEN
        DELETE FROM pgfifo.group_control AS c WHERE c.queue = p_queue AND c.group_id = v_key;
    ELSE
        INSERT INTO pgfifo.group_control AS c
            (queue, group_id, rate_count, rate_period_ms, burst, concurrency, weight)
        VALUES (p_queue, v_key, p_rate_count, p_rate_period_ms, p_burst, p_concurrency, p_weight)
        ON CONFLICT (queue, group_id) DO UPDATE
        SET rate_count = excluded.rate_count, rate_period_ms = excluded.rate_period_ms,
            burst = excluded.burst, concurrency = excluded.concurrency,
            weight = excluded.weight, updated_at = now();
    END IF;
    PERFORM pgfifo.apply_group_control(p_queue, p_group);
    RETURN coalesce(v_found, false);
END
$$;

-- Changes some of a group's limits (p_group NULL: the queue's defaults)
-- and keeps the others, in one statement: p_change names those that
-- change ('rate', 'burst', 'concurrency', 'weight'), to the values given
-- (NULL: unset). Two changes of different limits at once both hold (the
-- second waits for the first's row, then changes the row it left). A row
-- left with nothing set is deleted: that is the same as no row. Returns
-- the row as it is now, or nothing when it was deleted.
CREATE OR REPLACE FUNCTION pgfifo.change_group_control(
    p_queue          text,
    p_group          text,
    p_change         text[],
    p_rate_count     integer,
    p_rate_period_ms bigint,
    p_burst          integer,
    p_concurrency    integer,
    p_weight         integer
)
RETURNS TABLE (group_id text, rate_count integer, rate_period_ms bigint, burst integer,
               concurrency integer, weight integer)
LANGUAGE plpgsql
AS $$
DECLARE
    v_key  text := coalesce(p_group, '');
    v_rate boolean := 'rate' = ANY (p_change);
    v_row  pgfifo.group_control;
    v_bad  text;
BEGIN
    /*@dist
    IF 'weight' = ANY (p_change) AND p_weight > 1 THEN
        PERFORM pgfifo.not_distributed('weights (group controls)');
    END IF;
    */
    SELECT c INTO v_bad FROM unnest(p_change) AS c
    WHERE c NOT IN ('rate', 'burst', 'concurrency', 'weight') LIMIT 1;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'pgfifo change_group_control: % is not a limit (rate, burst, concurrency, weight)', v_bad
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pgfifo.check_group_control(p_group, p_rate_count, p_rate_period_ms);
    INSERT INTO pgfifo.group_control AS c
        (queue, group_id, rate_count, rate_period_ms, burst, concurrency, weight)
    VALUES (p_queue, v_key,
            CASE WHEN v_rate THEN p_rate_count END,
            CASE WHEN v_rate THEN p_rate_period_ms END,
            CASE WHEN 'burst' = ANY (p_change) THEN p_burst END,
            CASE WHEN 'concurrency' = ANY (p_change) THEN p_concurrency END,
            CASE WHEN 'weight' = ANY (p_change) THEN p_weight END)
    ON CONFLICT ON CONSTRAINT group_control_pkey DO UPDATE
    SET rate_count = CASE WHEN v_rate THEN excluded.rate_count ELSE c.rate_count END,
        rate_period_ms = CASE WHEN v_rate THEN excluded.rate_period_ms ELSE c.rate_period_ms END,
        burst = CASE WHEN 'burst' = ANY (p_change) THEN excluded.burst ELSE c.burst END,
        concurrency = CASE WHEN 'concurrency' = ANY (p_change) THEN excluded.concurrency
                           ELSE c.concurrency END,
        weight = CASE WHEN 'weight' = ANY (p_change) THEN excluded.weight ELSE c.weight END,
        updated_at = now()
    RETURNING c.* INTO v_row;
    IF num_nulls(v_row.rate_count, v_row.burst, v_row.concurrency, v_row.weight) = 4 THEN
        DELETE FROM pgfifo.group_control AS c WHERE c.queue = p_queue AND c.group_id = v_key;
    ELSE
        group_id := v_row.group_id;
        rate_count := v_row.rate_count;
        rate_period_ms := v_row.rate_period_ms;
        burst := v_row.burst;
        concurrency := v_row.concurrency;
        weight := v_row.weight;
        RETURN NEXT;
    END IF;
    PERFORM pgfifo.apply_group_control(p_queue, p_group);
END
$$;

-- Deletes the slot, bucket, snooze and share rows of groups whose group row is
-- gone (retention deleted the idle group; a group that comes back starts
-- afresh: a full bucket, slots made again when it becomes active). A bucket
-- goes only once it has refilled: a group that comes back must not get
-- tokens its limit has not given it yet. At most p_limit rows of each
-- table. Returns how many rows it deleted.
CREATE OR REPLACE FUNCTION pgfifo.clean_group_controls(p_limit integer) RETURNS bigint
LANGUAGE plpgsql
/*@dist SET plan_cache_mode = force_custom_plan */
AS $$
DECLARE
    v_n    bigint := 0;
    v_rows bigint;
    /*@dist v_cand record; v_table text; v_lim record; */
BEGIN
    /*@dist
    -- Distributed: the orphans of each table are read from every shard
    -- without locks, then each group's rows deleted by a statement that
    -- names its part, checked again under FOR UPDATE SKIP LOCKED (Citus
    -- routes a locking read only when its part is one constant). A bucket
    -- is read before: it goes once refilled, as below. (Weights refuse on
    -- this layout: it has no shares.)
    FOREACH v_table IN ARRAY ARRAY['group_slot', 'group_bucket', 'group_snooze'] LOOP
        FOR v_cand IN EXECUTE format(
            'SELECT DISTINCT x.part, x.queue, x.group_id FROM pgfifo.%I AS x
             WHERE NOT EXISTS (SELECT 1 FROM pgfifo.queue_group AS g
                               WHERE g.part = x.part AND g.queue = x.queue
                                 AND g.group_id = x.group_id)
             LIMIT $1', v_table) USING p_limit
        LOOP
            IF v_table = 'group_bucket' THEN
                SELECT * INTO v_lim FROM pgfifo.group_limits(v_cand.queue, v_cand.group_id);
                CONTINUE WHEN v_lim.rate_count IS NOT NULL
                              AND pgfifo.bucket_tokens(v_cand.queue, v_cand.group_id, now(),
                                                       v_lim.rate_count, v_lim.rate_period_ms,
                                                       v_lim.burst) < v_lim.burst - 1e-9;
            END IF;
            EXECUTE format(
                'DELETE FROM pgfifo.%1$I AS z
                 WHERE z.part = $1 AND (z.queue, z.group_id) IN (
                     SELECT x.queue, x.group_id FROM pgfifo.%1$I AS x
                     WHERE x.part = $1 AND x.queue = $2 AND x.group_id = $3
                       AND NOT EXISTS (SELECT 1 FROM pgfifo.queue_group AS g
                                       WHERE g.part = $1 AND g.queue = x.queue
                                         AND g.group_id = x.group_id)
                     FOR UPDATE SKIP LOCKED)', v_table)
            USING v_cand.part, v_cand.queue, v_cand.group_id;
            GET DIAGNOSTICS v_rows = ROW_COUNT;
            v_n := v_n + v_rows;
        END LOOP;
    END LOOP;
    RETURN v_n;
    */
    DELETE FROM pgfifo.group_slot AS s
    WHERE (s.queue, s.group_id, s.slot) IN (
        SELECT x.queue, x.group_id, x.slot FROM pgfifo.group_slot AS x
        WHERE NOT EXISTS (SELECT 1 FROM pgfifo.queue_group AS g
                          WHERE g.queue = x.queue AND g.group_id = x.group_id)
        LIMIT p_limit FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    v_n := v_n + v_rows;
    DELETE FROM pgfifo.group_bucket AS b
    WHERE (b.queue, b.group_id) IN (
        SELECT x.queue, x.group_id FROM pgfifo.group_bucket AS x
        CROSS JOIN LATERAL pgfifo.group_limits(x.queue, x.group_id) AS r
        WHERE NOT EXISTS (SELECT 1 FROM pgfifo.queue_group AS g
                          WHERE g.queue = x.queue AND g.group_id = x.group_id)
          AND (r.rate_count IS NULL
               OR pgfifo.bucket_tokens(x.queue, x.group_id, now(), r.rate_count,
                                       r.rate_period_ms, r.burst) >= r.burst - 1e-9)
        LIMIT p_limit FOR UPDATE OF x SKIP LOCKED);
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    v_n := v_n + v_rows;
    DELETE FROM pgfifo.group_snooze AS z
    WHERE (z.queue, z.group_id) IN (
        SELECT x.queue, x.group_id FROM pgfifo.group_snooze AS x
        WHERE NOT EXISTS (SELECT 1 FROM pgfifo.queue_group AS g
                          WHERE g.queue = x.queue AND g.group_id = x.group_id)
        LIMIT p_limit FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    v_n := v_n + v_rows;
    -- (A group that comes back starts from the queue's floor.)
    IF to_regclass('pgfifo.group_share') IS NOT NULL THEN
        DELETE FROM pgfifo.group_share AS z
        WHERE (z.queue, z.group_id) IN (
            SELECT x.queue, x.group_id FROM pgfifo.group_share AS x
            WHERE NOT EXISTS (SELECT 1 FROM pgfifo.queue_group AS g
                              WHERE g.queue = x.queue AND g.group_id = x.group_id)
            LIMIT p_limit FOR UPDATE SKIP LOCKED);
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        v_n := v_n + v_rows;
    END IF;
    RETURN v_n;
END
$$;

-- Weights: the groups' shares (start-time fair queueing; see migration
-- 0008 and pgfifo.pick). Whether weights act in a queue: a weight above 1
-- is set there, and the shares table exists (after `migrate down` to a
-- schema without it, they do not).
CREATE OR REPLACE FUNCTION pgfifo.queue_weighted(p_queue text) RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN to_regclass('pgfifo.group_share') IS NOT NULL
       AND EXISTS (SELECT 1 FROM pgfifo.group_control AS c
                   WHERE c.queue = p_queue AND c.weight > 1);
END
$$;

-- How far, in units of virtual time (one start of a weight-1 group), a
-- group with backlog may fall behind its queue's most advanced group and
-- still get the turns it missed: a group that could not use its share (it
-- ran as fast as its concurrency allows, or waited for a retry, a snooze
-- or a token) catches up, by at most this much.
CREATE OR REPLACE FUNCTION pgfifo.share_lag() RETURNS double precision
LANGUAGE sql IMMUTABLE
RETURN 10;

-- Counts p_starts starts (-1: a start handed back unstarted) of a group of
-- weight p_weight towards its share: 1 / weight each. A group without a
-- share yet starts one unit behind its queue's most advanced group; one
-- further behind than pgfifo.share_lag() is moved up to that first. Locks
-- the group's share row until the caller's transaction ends (takes of one
-- group are one after another).
CREATE OR REPLACE FUNCTION pgfifo.charge_share(
    p_queue text, p_group text, p_weight integer, p_starts integer
)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_front double precision;
    v_step  double precision := p_starts::double precision / greatest(coalesce(p_weight, 1), 1);
BEGIN
    IF p_starts < 0 THEN
        UPDATE pgfifo.group_share AS s SET vtime = s.vtime + v_step
        WHERE s.queue = p_queue AND s.group_id = p_group;
        RETURN;
    END IF;
    SELECT s.vtime INTO v_front FROM pgfifo.group_share AS s
    WHERE s.queue = p_queue ORDER BY s.vtime DESC LIMIT 1;
    INSERT INTO pgfifo.group_share AS s (queue, group_id, vtime)
    VALUES (p_queue, p_group, coalesce(v_front - 1, 0) + v_step)
    ON CONFLICT (queue, group_id) DO UPDATE
    SET vtime = greatest(s.vtime, coalesce(v_front - pgfifo.share_lag(), s.vtime)) + v_step;
END
$$;

-- A group of a queue with weights that becomes active after it was idle
-- rejoins one unit behind the queue's most advanced group (or where it
-- was, if that is further on): no credit for the time it had no work.
-- Called by promote.
CREATE OR REPLACE FUNCTION pgfifo.rejoin_share(p_queue text, p_group text)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_front double precision;
BEGIN
    SELECT s.vtime INTO v_front FROM pgfifo.group_share AS s
    WHERE s.queue = p_queue ORDER BY s.vtime DESC LIMIT 1;
    IF v_front IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO pgfifo.group_share AS s (queue, group_id, vtime)
    VALUES (p_queue, p_group, v_front - 1)
    ON CONFLICT (queue, group_id) DO UPDATE
    SET vtime = greatest(s.vtime, excluded.vtime);
END
$$;

-- The ready groups of one priority level of a queue with weights, as the
-- pick offers them: lowest share first (a group without a share counts
-- one unit behind the most advanced group, one further behind than
-- pgfifo.share_lag() counts at that lag), ties round robin from slot
-- p_slot; with each its head. Reads every ready group of the level.
CREATE OR REPLACE FUNCTION pgfifo.share_candidates(
    p_queue text, p_priority smallint, p_slot integer, p_now timestamptz
)
RETURNS TABLE (c_group text, c_ready timestamptz, c_tag double precision, c_head bigint)
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_front double precision;
BEGIN
    SELECT s.vtime INTO v_front FROM pgfifo.group_share AS s
    WHERE s.queue = p_queue ORDER BY s.vtime DESC LIMIT 1;
    RETURN QUERY
    SELECT g.group_id, g.ready_at,
           coalesce(greatest(s.vtime, v_front - pgfifo.share_lag()), v_front - 1, 0), g.head_id
    FROM pgfifo.queue_group AS g
    LEFT JOIN pgfifo.group_share AS s ON s.queue = g.queue AND s.group_id = g.group_id
    WHERE g.queue = p_queue AND g.ready_at IS NOT NULL AND g.priority = p_priority
      AND g.ready_at <= p_now
    ORDER BY 3, g.slot < p_slot, g.slot;
END
$$;

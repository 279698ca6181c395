-- Taking a batch's ended jobs off its shards' counts (see "Counting" in
-- 17_batches.sql, which calls these from batch_count_outcomes).
--
-- Installed whole by `migrate` (CREATE OR REPLACE) after the numbered
-- migrations; see crates/pgfifo/src/migrate.rs and docs/upgrading.md for
-- how a change of arguments or result type is made. Dropped with
-- migration 0012 (its down.sql).

-- Takes p_n jobs (p_s succeeded, p_f failed, p_c cancelled) off batch
-- p_batch's remaining ones; returns how many shards it emptied. A job may
-- be taken off any shard (a shard holds a number of jobs, not which ones),
-- so a completion takes them without waiting from shards that no other
-- transaction holds: runners ending jobs of one batch at the same moment
-- update different rows. In turn, until one gives them all:
--   1. of two neighbouring shards drawn at random, the one with more left,
--      if it has enough;
--   2. the first free shard with enough left, from the two drawn on;
--   3. (near the batch's end) what the free shards have left, one after
--      the other;
--   4. (the batch's last jobs, when the free shards do not have enough
--      left) waiting for the shards, in shard order, taking what each has.
--
-- Why the one with more left: the shards' counts then stay close to each
-- other (the "power of two choices") and run out together, at the batch's
-- end. A shard that ran out early would send its takers on to the next
-- ones (step 2), and they would pile up there; near the end, every
-- completion would meet at the last few shards and wait (step 4). (Taking
-- shards down one after another was measured too: its takers queued at
-- the batch's end, in step 4.)
--
-- Steps 1 to 3 run in a subtransaction, undone when they fall short: a
-- locking read may keep a row locked that it then finds it cannot use (its
-- new version fails the check), and a transaction that waited for shards
-- in order while it held another could wait for one that waits for it.
-- So a completion waits for a batch's shards holding none of them, and for
-- batches in id order (see batch_count_outcomes): no two wait for each
-- other.
CREATE OR REPLACE FUNCTION pgfifo.batch_take(p_batch bigint, p_n integer, p_s integer, p_f integer, p_c integer)
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    v_left    integer;
    v_start   integer := floor(random() * 64)::integer;
    v_from    integer;
    v_to      integer;
    v_took    integer[];
BEGIN
    BEGIN
        -- 1. The two shards drawn (a range of the key: the index reads two
        -- rows, where a list of two keys would read the batch's every
        -- shard).
        UPDATE pgfifo.batch_shard AS s
        SET remaining = s.remaining - p_n, succeeded = s.succeeded + p_s,
            failed = s.failed + p_f, cancelled = s.cancelled + p_c
        WHERE s.batch_id = p_batch
          AND s.shard = (SELECT x.shard FROM pgfifo.batch_shard AS x
                         WHERE x.batch_id = p_batch AND x.shard BETWEEN v_start AND v_start + 1
                           AND x.remaining >= p_n
                         ORDER BY x.remaining DESC
                         LIMIT 1
                         FOR UPDATE SKIP LOCKED)
        RETURNING s.remaining INTO v_left;
        IF FOUND THEN
            RETURN CASE WHEN v_left = 0 THEN 1 ELSE 0 END;
        END IF;
        -- 2. The shards after the two drawn, then from 0.
        FOR v_from, v_to IN VALUES (v_start + 2, 63), (0, v_start - 1) LOOP
            UPDATE pgfifo.batch_shard AS s
            SET remaining = s.remaining - p_n, succeeded = s.succeeded + p_s,
                failed = s.failed + p_f, cancelled = s.cancelled + p_c
            WHERE s.batch_id = p_batch
              AND s.shard = (SELECT x.shard FROM pgfifo.batch_shard AS x
                             WHERE x.batch_id = p_batch AND x.shard BETWEEN v_from AND v_to
                               AND x.remaining >= p_n
                             ORDER BY x.batch_id, x.shard
                             LIMIT 1
                             FOR UPDATE SKIP LOCKED)
            RETURNING s.remaining INTO v_left;
            IF FOUND THEN
                RETURN CASE WHEN v_left = 0 THEN 1 ELSE 0 END;
            END IF;
        END LOOP;
        -- 3. What the free shards have left.
        v_took := pgfifo.batch_take_spread(p_batch, p_n, p_s, p_f, p_c, false);
        IF v_took[1] = 0 THEN
            RETURN v_took[2];
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'no_data_found';
    EXCEPTION WHEN no_data_found THEN
        -- Undone: the shards it took or locked are free again.
    END;
    -- 4. Waiting.
    v_took := pgfifo.batch_take_spread(p_batch, p_n, p_s, p_f, p_c, true);
    IF v_took[1] > 0 THEN
        RAISE WARNING 'pgfifo batch %: % more jobs ended than it has', p_batch, v_took[1];
    END IF;
    RETURN v_took[2];
END
$$;

-- batch_take's steps 3 and 4: takes up to p_n jobs off batch p_batch's
-- shards that have some left, in shard order, from as many shards as it
-- needs; the counts of outcomes go to the first. p_wait: waits for the
-- shards other transactions hold; otherwise skips them. Returns how many
-- jobs it could not take, and how many shards it emptied.
CREATE OR REPLACE FUNCTION pgfifo.batch_take_spread(
    p_batch bigint, p_n integer, p_s integer, p_f integer, p_c integer, p_wait boolean)
RETURNS integer[]
LANGUAGE plpgsql
AS $$
DECLARE
    v_shard   smallint;
    v_left    integer;
    v_need    integer := p_n;
    v_take    integer;
    v_emptied integer := 0;
    v_counted boolean := false;
BEGIN
    -- Without waiting, shards with nothing left are skipped without a lock.
    -- Waiting, every shard is locked in turn: jobs added to an open batch
    -- meanwhile may have filled one that had nothing. And shard 0 first,
    -- before the shards are listed: adding jobs (batch_count_jobs) locks it
    -- first too, so an add that was under way has committed when the list
    -- is read (shards it created are in it), and a later add waits for this
    -- transaction. Otherwise others could take the counts of the listed
    -- shards while the jobs this one ends are counted in new ones.
    IF p_wait THEN
        PERFORM 1 FROM pgfifo.batch_shard AS s
        WHERE s.batch_id = p_batch AND s.shard = 0
        FOR UPDATE;
    END IF;
    FOR v_shard IN
        SELECT s.shard FROM pgfifo.batch_shard AS s
        WHERE s.batch_id = p_batch AND (p_wait OR s.remaining > 0)
        ORDER BY s.batch_id, s.shard
    LOOP
        EXIT WHEN v_need = 0;
        IF p_wait THEN
            SELECT s.remaining INTO v_left FROM pgfifo.batch_shard AS s
            WHERE s.batch_id = p_batch AND s.shard = v_shard
            FOR UPDATE;
        ELSE
            SELECT s.remaining INTO v_left FROM pgfifo.batch_shard AS s
            WHERE s.batch_id = p_batch AND s.shard = v_shard
            FOR UPDATE SKIP LOCKED;
            CONTINUE WHEN NOT FOUND;
        END IF;
        v_take := least(v_left, v_need);
        CONTINUE WHEN v_take <= 0;
        UPDATE pgfifo.batch_shard AS s
        SET remaining = s.remaining - v_take,
            succeeded = s.succeeded + CASE WHEN v_counted THEN 0 ELSE p_s END,
            failed = s.failed + CASE WHEN v_counted THEN 0 ELSE p_f END,
            cancelled = s.cancelled + CASE WHEN v_counted THEN 0 ELSE p_c END
        WHERE s.batch_id = p_batch AND s.shard = v_shard;
        v_counted := true;
        v_need := v_need - v_take;
        IF v_left = v_take THEN
            v_emptied := v_emptied + 1;
        END IF;
    END LOOP;
    RETURN ARRAY[v_need, v_emptied];
END
$$;

-- The pick: free groups' heads (and ungrouped jobs), locked for a runner.
--
-- Installed whole by `migrate` (CREATE OR REPLACE) after the numbered
-- migrations; see crates/pgfifo/src/migrate.rs and docs/upgrading.md for
-- how a change of arguments or result type is made.

-- Picks up to p_limit jobs to run, of different groups, and locks them;
-- then, if that left no other work ready, up to pgfifo.pick_batch jobs in
-- all by taking the next jobs of the groups it took (followers, below).
-- pgfifo.pick_batch is a transaction-local setting the caller sets in the
-- statement that calls pick (a runner of 0.1.0 does not set it, and gets
-- no followers: it runs a pick's jobs as jobs of different groups; the
-- arguments stay 0.1.0's, see docs/upgrading.md). Called as
-- the first statement of the runner's job transaction T, after BEGIN. The
-- jobs then run one after another in T, in the order returned (see the
-- runner's lanes for when several share T).
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
-- Weights. In a queue where a weight above 1 is set, the groups of a
-- priority level are offered lowest share first instead: start-time fair
-- queueing over pgfifo.group_share (migration 0008), where each start of a
-- group adds 1 / its weight to its share (pgfifo.charge_share, when the
-- attempt is recorded). Among groups that compete for slots, starts then
-- go in proportion to the weights, for two groups as for many, and for
-- groups of any concurrency. Ties go round robin from p_slot. Reading the
-- shares costs a look at every ready group of the level
-- (pgfifo.share_candidates), so weights suit queues of up to some
-- thousands of ready groups (docs/group-controls.md).
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
-- Slots. A group whose concurrency N is above 1 (group controls, only in
-- queues with rows in pgfifo.group_control) is not held by its group row:
-- each of its running jobs holds one of its slot rows 0 .. N-1
-- (pgfifo.group_slot) FOR UPDATE, with its job row, until T ends. So at
-- most N run, whatever the runners, and a crash frees the slot with the
-- transaction. The job is the oldest queued job of the group that nobody
-- holds, read with a snapshot taken after the slot's lock; if that job may
-- not start yet (it waits for its retry or its time), nothing of the group
-- starts. Such a group's row is written only briefly, by complete, promote
-- and parking, never held for a job's run. At most one such slot job per
-- pick, returned first, and only when the transaction-local setting
-- pgfifo.pick_slots is not 'off' (the runner turns it off when the lane has
-- no free permit to run a handler at once): a slot job picked but not
-- started at once (behind another handler of its pick, or waiting for a
-- permit, or handed back) would let younger jobs of its group start and end
-- in other slots before it begins.
--
-- Queue limits. In a queue with a row in pgfifo.queue_control (migration
-- 0011, 16_queue_limits.sql), a pick first needs what the queue allows: a
-- token in its bucket, if it has a rate, and one of its slot rows 0 .. N-1
-- (pgfifo.queue_slot), locked FOR UPDATE SKIP LOCKED, if it has a
-- concurrency: T holds that slot while the pick's jobs run, one after
-- another, so at most N lanes run the queue's jobs at once, whatever the
-- runners, and a crash frees the slot with T. Without either, the queue is
-- passed by. Such a queue is visited only by a pick that has taken nothing
-- yet and can start a job at once (pgfifo.pick_slots: a prefetched pick
-- would sit on a slot), and a pick in a queue with a rate takes one job and
-- no followers (each start takes a token when its attempt is recorded: the
-- tokens of several jobs would be taken before the first one ran). If the
-- queue then gives nothing and queues are left to visit, the pick returns
-- the row with a NULL id: the slot must not stay held for other queues'
-- jobs. Groups' turns (round robin, weights) are unchanged: whichever group
-- the walk reaches first gets the queue's free slot. The slot is what such
-- a queue is short of, so a pick that takes one takes up to
-- pgfifo.pick_slot_batch jobs (the runner's batch for a slot, longer than
-- pgfifo.pick_batch; unset, pick_batch), heads first, and walks twice as
-- many busy groups before it gives up looking for free ones. A slot is also
-- guarded by an advisory lock (class 1885824625, 'pgfq'), which T takes
-- with the row: a long run claimed in T keeps it at session level after T
-- commits (pgfifo.claim_long_run), and the pick passes over a slot whose
-- advisory lock a long run's session holds.
--
-- Long runs. A job of a type in long mode is claimed right after its pick
-- (pgfifo.claim_long_run) and T commits at once: the group is then held by
-- a committed row of pgfifo.job_run and its holder's session-level
-- advisory lock, and marked by ready_at = '-infinity'. The mark is read
-- with the candidate (no extra lookup for other groups): such a group is
-- busy while its holder's session lives, and reclaimed in T (its run row
-- deleted, the job a queued head again) once it is gone.
--
-- Followers. A group with a backlog of quick jobs runs one job at a time
-- whatever the workers: its speed is that of one job's transaction. So a
-- pick that took every free group it could (the walk ran out of candidates:
-- `more` is false) and has room left under pgfifo.pick_batch also takes the jobs that
-- come next in the groups it took, when they may start now: in id order,
-- right behind the head, stopping at the first that is not queued, waits
-- for its time (a delay), has another priority than the head, or is locked
-- by someone else (an operator's transaction; a job of a group whose
-- concurrency was just lowered, still running in its slot). Only for
-- groups held by their row (concurrency 1) without a rate limit: a slot
-- group's jobs are taken one per pick, and a rate limit takes its tokens
-- one start at a time; and not in a queue with weights, where each start
-- takes its group's turn (followers would take turns that are others').
-- A follower is locked FOR UPDATE like its head and returned after every
-- head, its group's in id order; T holds the group row throughout, so
-- nobody else can start any of them. The runner runs a follower only once
-- every earlier job of its group has succeeded, and
-- hands it back otherwise (see pgfifo.complete for how several jobs of one
-- group are completed). Followers never change `more`: their group's next
-- job is reported by complete.
--
-- A worker that stops without closing its connection (frozen by SIGSTOP, a
-- stalled VM) would hold its groups forever. pick therefore bounds how long T
-- may sit idle: p_idle_ms[i] for jobs of kind p_kinds[i], p_default_idle_ms
-- for others (the runner passes each type's timeout plus a grace); with
-- several jobs, the longest of theirs. Past it, the server ends the session,
-- T aborts and the groups are free. (A peer that vanished from the network is
-- detected by TCP keepalives: see docs/failure-model.md for the connection
-- settings.)
CREATE OR REPLACE FUNCTION pgfifo.pick/*@dist _in*/(
    /*@dist p_parts integer[], */
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
SET plan_cache_mode = /*@plain*/ force_generic_plan /*@end*/ /*@dist force_custom_plan */
AS $$
DECLARE
    v_n       integer := cardinality(p_queues);
    v_turn    bigint := p_turn::bigint & 2147483647;
    v_limit   integer := greatest(coalesce(p_limit, 1), 1);
    -- Unset (0.1.0's runners): no followers.
    v_batch   integer := coalesce(nullif(current_setting('pgfifo.pick_batch', true), '')::integer, 0);
    -- Unset (runners before 0.3.0): a queue's slot carries pick_batch.
    v_slot_batch integer := coalesce(nullif(current_setting('pgfifo.pick_slot_batch', true), '')::integer, 0);
    v_follow  bigint[] := '{}';
    v_heads   integer;
    v_f       record;
    v_lead    pgfifo.job;
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
    v_w_groups text[];
    v_w_ready timestamptz[];
    v_w_tags  double precision[];
    v_w_heads bigint[];
    v_lo      bigint;
    v_hi      bigint;
    v_job     pgfifo.job;
    v_slot    integer := p_slot;
    v_now     timestamptz := statement_timestamp();
    v_bound   integer;
    v_prio    smallint;
    v_controlled boolean;
    v_due     timestamptz;
    v_conc    integer;
    v_lim     record;
    v_first   bigint[];
    v_wait_id bigint;
    v_fail_id bigint;
    v_slotted boolean;
    v_took    boolean;
    v_heaviest integer;
    v_weighted boolean;
    v_tag_min double precision;
    v_declined boolean := false;
    v_q_declined boolean;
    v_min_soon boolean;
    v_next_turn double precision;
    v_soon    bigint[] := coalesce(nullif(current_setting('pgfifo.pick_soon', true), '')::bigint[], '{}');
    v_slot_job boolean := false;
    v_slot_left boolean := false;
    v_slots_ok boolean := current_setting('pgfifo.pick_slots', true) IS DISTINCT FROM 'off';
    v_q_limits boolean := to_regclass('pgfifo.queue_control') IS NOT NULL;
    v_ql      record;
    v_q_slot  boolean;
    v_limit0  integer;
    v_batch0  integer;
    v_qs      integer;
    v_qs_from integer;
    /*@dist v_part integer; */
BEGIN
    -- Locks taken here must outlive this statement. In autocommit they would
    -- be released at once, and the caller would run a job it does not hold.
    -- The runner opens job transactions with BEGIN and a transaction-local
    -- marker; if that BEGIN was skipped (the COMMIT before it failed), the
    -- marker is absent.
    IF current_setting('pgfifo.job_transaction', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION 'pgfifo.pick must run in a job transaction (BEGIN; SELECT set_config(''pgfifo.job_transaction'', ''on'', true))'
            USING ERRCODE = 'no_active_sql_transaction', CONSTRAINT = 'pgfifo_job_transaction';
    END IF;
    <<queues>>
    FOR v_i IN 0 .. coalesce(v_n, 0) - 1 LOOP
        v_q := p_queues[1 + (v_turn + v_i) % v_n];
        CONTINUE WHEN EXISTS (SELECT 1 FROM pgfifo.queue_setting AS s
                              WHERE s.queue = v_q AND s.paused);
        -- Queue limits (see "Queue limits" above): a queue without a row
        -- costs this one probe.
        v_q_slot := false;
        v_limit0 := v_limit;
        v_batch0 := v_batch;
        IF v_q_limits THEN
            SELECT c.concurrency, c.rate_count, c.rate_period_ms, coalesce(c.burst, c.rate_count) AS burst
            INTO v_ql FROM pgfifo.queue_control AS c WHERE c.queue = v_q;
            IF FOUND THEN
                CONTINUE WHEN NOT v_slots_ok OR v_count > 0;
                CONTINUE WHEN v_ql.rate_count IS NOT NULL
                              AND pgfifo.queue_bucket_due(v_q, v_now, v_ql.rate_count, v_ql.rate_period_ms,
                                                          v_ql.burst) > v_now;
                -- (Distributed, where the pick serves several queues: a
                -- shard with no ready work of the queue is passed by
                -- before its slot is taken, which would end the visit
                -- (above) or be rolled back by pgfifo.pick. With one
                -- queue, a later shard's visit takes its jobs under the
                -- same slot, and the two reads would cost more than they
                -- save.)
                /*@dist
                CONTINUE WHEN v_n > 1
                              AND NOT EXISTS (SELECT 1 FROM pgfifo.queue_group AS g
                                          WHERE g.queue = v_q AND g.ready_at IS NOT NULL
                                            AND g.ready_at <= v_now AND g.part = ANY (p_parts))
                              AND NOT EXISTS (SELECT 1 FROM pgfifo.job AS j
                                              WHERE j.queue = v_q AND j.group_id IS NULL
                                                AND j.state = 'queued' AND j.run_after <= v_now
                                                AND j.part = ANY (p_parts));
                */
                IF v_ql.concurrency IS NOT NULL THEN
                    -- Slots at or above a lowered concurrency (rows the
                    -- change left, see change_queue_control): the free
                    -- ones go; while a job that started before the change
                    -- holds one, the queue starts nothing, so that it never
                    -- runs more than the new limit once started again.
                    IF EXISTS (SELECT 1 FROM pgfifo.queue_slot AS s
                               WHERE s.queue = v_q AND s.slot >= v_ql.concurrency) THEN
                        DELETE FROM pgfifo.queue_slot AS s
                        WHERE s.queue = v_q AND s.slot >= v_ql.concurrency
                          AND s.slot IN (SELECT x.slot FROM pgfifo.queue_slot AS x
                                         WHERE x.queue = v_q AND x.slot >= v_ql.concurrency
                                         FOR UPDATE SKIP LOCKED)
                          AND pg_try_advisory_xact_lock(1885824625, pgfifo.queue_slot_key(v_q, s.slot));
                        CONTINUE WHEN EXISTS (SELECT 1 FROM pgfifo.queue_slot AS s
                                              WHERE s.queue = v_q AND s.slot >= v_ql.concurrency);
                    END IF;
                    -- A free slot row whose advisory lock no long run's
                    -- session holds (a slot row skipped for that stays
                    -- locked until T ends: its long run holds it anyway).
                    v_qs_from := -1;
                    LOOP
                        SELECT s.slot INTO v_qs FROM pgfifo.queue_slot AS s
                        WHERE s.queue = v_q AND s.slot < v_ql.concurrency AND s.slot > v_qs_from
                        ORDER BY s.slot LIMIT 1
                        FOR UPDATE SKIP LOCKED;
                        EXIT WHEN NOT FOUND;
                        v_qs_from := v_qs;
                        IF pg_try_advisory_xact_lock(1885824625, pgfifo.queue_slot_key(v_q, v_qs)) THEN
                            v_q_slot := true;
                            EXIT;
                        END IF;
                    END LOOP;
                    CONTINUE WHEN NOT v_q_slot; -- at its limit
                    -- For a long run claimed in T (pgfifo.claim_long_run).
                    PERFORM set_config('pgfifo.queue_slot', v_q || chr(31) || v_qs, true);
                    -- The slot is what the queue is short of: it carries as
                    -- many jobs as fit in the lane's window for a slot (see
                    -- "Queue limits" above), heads and followers.
                    v_batch := greatest(v_batch, v_slot_batch);
                    v_limit := greatest(v_limit, v_batch);
                END IF;
                IF v_ql.rate_count IS NOT NULL THEN
                    v_limit := 1;
                    v_batch := 0;
                END IF;
            END IF;
        END IF;
        v_controlled := to_regclass('pgfifo.group_control') IS NOT NULL;
        IF v_controlled THEN
            v_controlled := EXISTS (SELECT 1 FROM pgfifo.group_control AS c WHERE c.queue = v_q);
        END IF;
        v_heaviest := 1;
        IF v_controlled /*@dist AND false */ THEN
            SELECT coalesce(max(c.weight), 1) INTO v_heaviest
            FROM pgfifo.group_control AS c WHERE c.queue = v_q;
        END IF;
        -- Weights (see "Weights" above): after `migrate down` to a schema
        -- without shares, round robin as in a queue without them.
        -- (Distributed: weights refuse on this layout, and distribute refuses
        -- a database that has any.)
        v_weighted := v_heaviest > 1 AND to_regclass('pgfifo.group_share') IS NOT NULL
                      /*@dist AND false */;
        v_q_declined := false;
        v_next_turn := NULL;
        FOR v_kind IN 0 .. 1 LOOP
            IF (v_kind + v_turn) % 2 = 0 THEN
                v_bound := 32768;
                LOOP
                    -- The next priority level that has active groups.
                    SELECT g.priority INTO v_prio FROM pgfifo.queue_group AS g
                    WHERE g.queue = v_q AND g.ready_at IS NOT NULL AND g.priority < v_bound
                      /*@dist AND g.part = ANY (p_parts) */
                    ORDER BY g.priority DESC LIMIT 1;
                    EXIT WHEN NOT FOUND;
                    -- Candidates are read without locks, from the cursor to the
                    -- end of the level, then from its start to the cursor. Each
                    -- is then locked by its key. (A locking scan with the
                    -- readiness conditions would keep the lock of a row that
                    -- stopped matching between snapshot and lock, such as a
                    -- group that just went idle, for the whole job.)
                    -- In a queue with weights, one pass in the order of
                    -- the groups' shares instead (see "Weights"), read
                    -- first: that statement is planned only in such a
                    -- queue, so that the function works on a schema
                    -- without shares, after `migrate down`.
                    v_tag_min := NULL;
                    IF v_weighted THEN
                        SELECT array_agg(c.c_group ORDER BY c.n), array_agg(c.c_ready ORDER BY c.n),
                               array_agg(c.c_tag ORDER BY c.n), array_agg(c.c_head ORDER BY c.n)
                        INTO v_w_groups, v_w_ready, v_w_tags, v_w_heads
                        FROM pgfifo.share_candidates(v_q, v_prio, v_slot, v_now)
                             WITH ORDINALITY AS c(c_group, c_ready, c_tag, c_head, n);
                    END IF;
                    FOR v_pass IN 0 .. 1 LOOP
                        IF v_pass = 0 THEN
                            v_lo := v_slot;
                            v_hi := 2147483647;
                        ELSE
                            v_lo := -2147483648;
                            v_hi := v_slot::bigint - 1;
                        END IF;
                        FOR v_cand IN
                            (SELECT o.group_id, o.ready_at, o.tag, o.head_id
                             FROM unnest(v_w_groups, v_w_ready, v_w_tags, v_w_heads)
                                  WITH ORDINALITY AS o(group_id, ready_at, tag, head_id, n)
                             WHERE v_weighted AND v_pass = 0
                             ORDER BY o.n)
                            UNION ALL
                            (SELECT g.group_id, g.ready_at, NULL::double precision, NULL::bigint
                             FROM pgfifo.queue_group AS g
                             WHERE NOT v_weighted AND g.queue = v_q AND g.ready_at IS NOT NULL
                               AND g.priority = v_prio AND g.slot BETWEEN v_lo AND v_hi
                               AND g.ready_at <= v_now /*@dist AND g.part = ANY (p_parts) */
                             ORDER BY g.slot)
                        LOOP
                            /*@dist v_part := pgfifo.part_of(v_q, v_cand.group_id); */
                            -- A busy queue has more active groups than free
                            -- ones: once jobs are picked, stop looking after a
                            -- while instead of trying every group's lock.
                            -- (Under a queue's slot, twice as long: the
                            -- slot is what the queue is short of.)
                            v_seen := v_seen + 1;
                            v_more := v_count > 0
                                      AND v_seen > CASE WHEN v_q_slot THEN 4 ELSE 2 END * v_limit + 8;
                            EXIT queues WHEN v_more;
                            -- Held by a long run (ready_at '-infinity', see
                            -- 45_long_run.sql): busy while its holder's
                            -- session lives, reclaimed once it is gone. (In
                            -- branches, so that a schema without long runs
                            -- never plans the call.)
                            IF v_cand.ready_at = '-infinity' THEN
                                CONTINUE WHEN NOT pgfifo.long_run_free(v_q, v_cand.group_id, NULL);
                            END IF;
                            -- A group that may run more than one job at once
                            -- (concurrency N > 1): see "Slots" below.
                            IF v_controlled THEN
                                SELECT * INTO v_lim FROM pgfifo.group_limits(v_q, v_cand.group_id);
                                v_conc := v_lim.concurrency;
                            END IF;
                            -- Weights: candidates come lowest share first
                            -- (ties round robin), and a lane that can
                            -- start a job at once takes the first it can
                            -- lock, so weights never idle a runner. Except:
                            --  * a lane that cannot start one at once
                            --    (pgfifo.pick_slots off) takes nothing: its
                            --    job would wait for a handler to finish,
                            --    holding a group that another runner's
                            --    free slot could run now, and whose turn it
                            --    may not be by then (with few groups, the
                            --    groups took turns whatever their weights);
                            --  * no lane takes a later turn's group while
                            --    the group whose turn it is is held by a lane
                            --    of its runner whose handlers are done
                            --    (pgfifo.pick_soon): that lane picks it again
                            --    as it commits;
                            --  * a pick of several jobs takes them turn by
                            --    turn: not a group whose turn comes after
                            --    the next turn of a group it took.
                            IF v_weighted THEN
                                IF v_tag_min IS NULL THEN
                                    v_tag_min := v_cand.tag;
                                    v_min_soon := v_cand.head_id = ANY (v_soon);
                                END IF;
                                IF NOT v_slots_ok
                                   OR v_cand.tag > v_tag_min + 1e-9 AND v_min_soon
                                   OR v_cand.tag > v_next_turn + 1e-9 THEN
                                    v_declined := true;
                                    v_q_declined := true;
                                    EXIT;
                                END IF;
                            END IF;
                            IF v_controlled AND v_conc > 1 THEN
                                -- A slot job is taken only by a lane that
                                -- can start it at once (the runner says so:
                                -- pgfifo.pick_slots), and at most one per
                                -- pick, run first: a job of such a group that
                                -- is picked but does not start (it waits for
                                -- a handler before it, or is handed back)
                                -- would let younger jobs of its group, in
                                -- other slots, start and end before it.
                                CONTINUE WHEN NOT v_slots_ok;
                                IF v_slot_job THEN
                                    v_slot_left := true;
                                    CONTINUE;
                                END IF;
                                -- A long run holds the whole group (its mark
                                -- can be overwritten by a sibling's retry).
                                IF to_regclass('pgfifo.job_run') IS NOT NULL THEN
                                    CONTINUE WHEN NOT pgfifo.long_run_free(v_q, v_cand.group_id, NULL);
                                END IF;
                                -- What decides whether the group may start a
                                -- job now is read first, without locks.
                                SELECT g.queue, g.group_id, g.head_id, g.slot, g.ready_at,
                                       EXISTS (SELECT 1 FROM pgfifo.group_pause AS p
                                               WHERE p.queue = g.queue AND p.group_id = g.group_id
                                                 /*@dist AND p.part = v_part */) AS paused
                                INTO v_group
                                FROM pgfifo.queue_group AS g
                                WHERE g.queue = v_q AND g.group_id = v_cand.group_id
                                  /*@dist AND g.part = v_part */;
                                CONTINUE WHEN NOT FOUND OR v_group.ready_at IS NULL OR v_group.ready_at > v_now
                                              OR v_group.head_id IS NULL;
                                IF v_group.paused THEN
                                    -- Parked like any paused group (below),
                                    -- with its row locked for the moment
                                    -- until the caller commits.
                                    CONTINUE WHEN v_count > 0;
                                    PERFORM 1 FROM pgfifo.queue_group AS g
                                    WHERE g.queue = v_q AND g.group_id = v_cand.group_id
                                      /*@dist AND g.part = v_part */
                                    FOR UPDATE OF g SKIP LOCKED;
                                    CONTINUE WHEN NOT FOUND;
                                    IF pg_try_advisory_xact_lock(1885824614,
                                                                 pgfifo.group_lock_key(v_q, v_group.group_id)) THEN
                                        UPDATE pgfifo.queue_group AS g
                                        SET head_id = NULL, ready_at = NULL, idle_since = v_now
                                        WHERE g.queue = v_q AND g.group_id = v_group.group_id
                                          /*@dist AND g.part = v_part */;
                                    END IF;
                                    RETURN QUERY SELECT NULL::bigint, v_q, v_group.group_id, NULL::text,
                                                        NULL::jsonb, NULL::integer, v_group.slot, NULL::boolean;
                                    RETURN;
                                END IF;
                                CONTINUE WHEN v_lim.rate_count IS NOT NULL
                                              AND pgfifo.bucket_due(v_q, v_cand.group_id, v_now,
                                                                    v_lim.rate_count, v_lim.rate_period_ms,
                                                                    v_lim.burst) > v_now;
                                -- The job to start: the oldest of the first N
                                -- queued jobs (they are the ones that may run:
                                -- past them, N older jobs are unfinished) that
                                -- no one runs, and only if it may start: a job
                                -- that waits for its time (a retry, a delay, a
                                -- snooze) holds back the jobs behind it, and so
                                -- does one that failed an attempt, until it
                                -- succeeds (or is cancelled or skipped), as with
                                -- a concurrency of 1. Only a job within these
                                -- bounds is locked: a job locked and not run
                                -- would be passed over by other picks until this
                                -- transaction ends.
                                SELECT array_agg(f.id ORDER BY f.id),
                                       min(f.id) FILTER (WHERE f.run_after > v_now),
                                       min(f.id) FILTER (WHERE f.attempts > 0)
                                INTO v_first, v_wait_id, v_fail_id
                                FROM (SELECT j.id, j.run_after, j.attempts FROM pgfifo.job AS j
                                      WHERE j.queue = v_q AND j.group_id = v_cand.group_id
                                        AND j.state = 'queued' /*@dist AND j.part = v_part */
                                      ORDER BY j.id LIMIT v_conc) AS f;
                                IF v_first IS NULL THEN
                                    -- Active with no queued job: its last
                                    -- head finished while an enqueuer was in
                                    -- flight (advance_head left it for a
                                    -- later look), or a completion that did
                                    -- not wait for the group's row left the
                                    -- head on a finished job. Move the head
                                    -- or declare the group idle, as for a
                                    -- finished head below.
                                    CONTINUE WHEN v_count > 0;
                                    PERFORM 1 FROM pgfifo.queue_group AS g
                                    WHERE g.queue = v_q AND g.group_id = v_cand.group_id
                                      /*@dist AND g.part = v_part */
                                    FOR UPDATE OF g SKIP LOCKED;
                                    CONTINUE WHEN NOT FOUND;
                                    PERFORM pgfifo.advance_head(v_q, v_group.group_id, v_group.head_id);
                                    RETURN QUERY SELECT NULL::bigint, v_q, v_group.group_id, NULL::text,
                                                        NULL::jsonb, NULL::integer, v_group.slot, NULL::boolean;
                                    RETURN;
                                END IF;
                                -- A slot, then the job. In a subtransaction, so
                                -- that a slot taken for a job that turns out to
                                -- be taken goes back at once instead of staying
                                -- held, unused, until this transaction ends.
                                v_slotted := false;
                                v_took := false;
                                BEGIN
                                    PERFORM 1 FROM pgfifo.group_slot AS s
                                    WHERE s.queue = v_q AND s.group_id = v_cand.group_id AND s.slot < v_conc
                                      /*@dist AND s.part = v_part */
                                    ORDER BY s.slot LIMIT 1
                                    FOR UPDATE SKIP LOCKED;
                                    v_slotted := FOUND;
                                    IF v_slotted THEN
                                        SELECT * INTO v_job FROM pgfifo.job AS j
                                        WHERE j.id = ANY (v_first) AND j.state = 'queued' AND j.run_after <= v_now
                                          /*@dist AND j.part = v_part */
                                          AND j.id < coalesce(v_wait_id, 9223372036854775807)
                                          AND j.id <= coalesce(v_fail_id, 9223372036854775807)
                                        ORDER BY j.id LIMIT 1
                                        FOR UPDATE SKIP LOCKED;
                                        v_took := FOUND;
                                        IF NOT v_took THEN
                                            RAISE SQLSTATE 'PF001';
                                        END IF;
                                    END IF;
                                EXCEPTION WHEN SQLSTATE 'PF001' THEN
                                    NULL; -- the slot goes back
                                END;
                                IF v_took THEN
                                    IF v_weighted THEN
                                        v_next_turn := least(v_next_turn, v_cand.tag + 1.0 / v_lim.weight);
                                    END IF;
                                    v_slot_job := true;
                                    -- Another of the group's first N jobs
                                    -- behind this one that may start (none
                                    -- before it waits or failed): a slot is
                                    -- free for it too, as at most N of the
                                    -- first N run. Another lane is woken for
                                    -- it (more), rather than a poll.
                                    v_slot_left := v_slot_left OR EXISTS (
                                        SELECT 1 FROM unnest(v_first) AS f(id)
                                        WHERE f.id > v_job.id
                                          AND f.id < coalesce(v_wait_id, 9223372036854775807)
                                          AND f.id <= coalesce(v_fail_id, 9223372036854775807));
                                    v_jobs := v_job || v_jobs;
                                    v_slots := v_group.slot || v_slots;
                                    v_ids := v_ids || v_job.id;
                                    v_count := v_count + 1;
                                    EXIT queues WHEN v_count >= v_limit;
                                    CONTINUE;
                                END IF;
                                CONTINUE WHEN v_slotted;
                                -- Every slot busy; or no slot rows yet (made by
                                -- promote and set_group_control): then the
                                -- group row serves as its one slot, below.
                                CONTINUE WHEN EXISTS (SELECT 1 FROM pgfifo.group_slot AS s
                                                      WHERE s.queue = v_q AND s.group_id = v_cand.group_id
                                                        /*@dist AND s.part = v_part */);
                            END IF;
                            -- (A pause committed while this statement runs is
                            -- seen by the next pick.)
                            -- (Distributed: the pause is read apart, as in
                            -- promote.)
                            SELECT g.queue, g.group_id, g.head_id, g.slot, g.ready_at,
                                   /*@plain*/
                                   EXISTS (SELECT 1 FROM pgfifo.group_pause AS p
                                           WHERE p.queue = g.queue AND p.group_id = g.group_id)
                                   /*@end*/
                                   /*@dist false */ AS paused
                            INTO v_group
                            FROM pgfifo.queue_group AS g
                            WHERE g.queue = v_q AND g.group_id = v_cand.group_id
                              /*@dist AND g.part = v_part */
                            FOR UPDATE OF g SKIP LOCKED;
                            CONTINUE WHEN NOT FOUND; -- busy: another runner holds it
                            /*@dist
                            v_group.paused := EXISTS (SELECT 1 FROM pgfifo.group_pause AS p
                                                      WHERE p.part = v_part AND p.queue = v_q
                                                        AND p.group_id = v_cand.group_id);
                            */
                            -- Taken by this very pick already: a lock this
                            -- transaction holds is granted to it again (the group
                            -- can turn up at a lower priority level, whose read
                            -- comes later).
                            CONTINUE WHEN v_group.head_id = ANY (v_ids);
                            -- Claimed for a long run since the candidate was
                            -- read (busy: this lock lasts until T ends, a
                            -- rare race), or reclaimed above: unmark it.
                            IF v_group.ready_at = '-infinity' THEN
                                CONTINUE WHEN NOT pgfifo.long_run_free(v_q, v_group.group_id, NULL);
                                UPDATE pgfifo.queue_group AS g SET ready_at = v_now
                                WHERE g.queue = v_q AND g.group_id = v_group.group_id
                                  /*@dist AND g.part = v_part */;
                                v_group.ready_at := v_now;
                            END IF;
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
                                        WHERE g.queue = v_q AND g.group_id = v_group.group_id
                                          /*@dist AND g.part = v_part */;
                                    ELSE
                                        UPDATE pgfifo.queue_group AS g
                                        SET ready_at = v_now + interval '50 milliseconds'
                                        WHERE g.queue = v_q AND g.group_id = v_group.group_id
                                          /*@dist AND g.part = v_part */;
                                    END IF;
                                END IF;
                                RETURN QUERY SELECT NULL::bigint, v_q, v_group.group_id, NULL::text,
                                                    NULL::jsonb, NULL::integer, v_group.slot, NULL::boolean;
                                RETURN;
                            END IF;
                            -- A rate-limited group without a token (its limits
                            -- changed since complete or promote set its time):
                            -- not before its next token. The runner learns of
                            -- that time from its next poll.
                            IF v_controlled THEN
                                v_due := v_now;
                                IF v_lim.rate_count IS NOT NULL THEN
                                    v_due := pgfifo.bucket_due(v_q, v_group.group_id, v_now, v_lim.rate_count,
                                                               v_lim.rate_period_ms, v_lim.burst);
                                END IF;
                                IF v_due > v_now THEN
                                    UPDATE pgfifo.queue_group AS g SET ready_at = v_due
                                    WHERE g.queue = v_q AND g.group_id = v_group.group_id
                                      /*@dist AND g.part = v_part */;
                                    CONTINUE WHEN v_count > 0;
                                    RETURN QUERY SELECT NULL::bigint, v_q, v_group.group_id, NULL::text,
                                                        NULL::jsonb, NULL::integer, v_group.slot, NULL::boolean;
                                    RETURN;
                                END IF;
                            END IF;
                            SELECT * INTO v_job FROM pgfifo.job AS j
                            WHERE j.id = v_group.head_id AND j.state = 'queued'
                              /*@dist AND j.part = v_part */
                            FOR UPDATE SKIP LOCKED;
                            IF NOT FOUND THEN
                                CONTINUE WHEN v_count > 0;
                                IF EXISTS (SELECT 1 FROM pgfifo.job AS j
                                           WHERE j.id = v_group.head_id AND j.state = 'queued'
                                             /*@dist AND j.part = v_part */) THEN
                                    -- Locked by an operator's transaction (never by
                                    -- a runner without the group), or running in
                                    -- a slot of a group whose concurrency was
                                    -- just lowered to 1: leave the group to it
                                    -- (in a queue with group controls, go on
                                    -- looking: this may last a job's run).
                                    CONTINUE WHEN v_controlled;
                                    RETURN QUERY SELECT NULL::bigint, v_q, v_group.group_id, NULL::text,
                                                        NULL::jsonb, NULL::integer, v_group.slot, NULL::boolean;
                                    RETURN;
                                END IF;
                                -- The head was finished or deleted out of band.
                                -- Repair the pointer; the row stays locked until T
                                -- ends, so run this group's new head or nothing.
                                -- Nothing, too, when advance_head took the group's
                                -- advisory lock (it looked for enqueuers in flight
                                -- and then found a job committed meanwhile): that
                                -- lock lasts until T ends, and enqueuers of the
                                -- group would wait for the job's whole run. The
                                -- caller commits and picks the new head again.
                                PERFORM pgfifo.advance_head(v_group.queue, v_group.group_id, v_group.head_id);
                                IF current_setting('pgfifo.holds_group_lock', true) = 'on' THEN
                                    RETURN QUERY SELECT NULL::bigint, v_q, v_group.group_id, NULL::text,
                                                        NULL::jsonb, NULL::integer, v_group.slot, NULL::boolean;
                                    RETURN;
                                END IF;
                                SELECT j.* INTO v_job
                                FROM pgfifo.queue_group AS g
                                JOIN pgfifo.job AS j ON j.id = g.head_id /*@dist AND j.part = g.part */
                                WHERE g.queue = v_group.queue AND g.group_id = v_group.group_id
                                  AND g.ready_at <= v_now AND j.state = 'queued'
                                  /*@dist AND g.part = v_part */
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
                            IF v_weighted THEN
                                v_next_turn := least(v_next_turn, v_cand.tag + 1.0 / v_lim.weight);
                            END IF;
                            -- Its next jobs may follow it (see "Followers").
                            IF NOT v_controlled THEN
                                v_follow := v_follow || v_job.id;
                            ELSIF v_conc = 1 AND v_lim.rate_count IS NULL AND NOT v_weighted THEN
                                v_follow := v_follow || v_job.id;
                            END IF;
                            EXIT queues WHEN v_count >= v_limit;
                        END LOOP;
                    END LOOP;
                    EXIT WHEN v_q_declined;
                    v_bound := v_prio;
                END LOOP;
            ELSE
                FOR v_job IN
                    SELECT * FROM pgfifo.job AS j
                    WHERE j.queue = v_q AND j.group_id IS NULL AND j.state = 'queued' AND j.run_after <= v_now
                      AND j.id <> ALL (v_ids) /*@dist AND j.part = ANY (p_parts) */
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
        -- A limited queue that gave nothing: its slot must not stay held
        -- while the jobs of the queues after it run. Commit and pick
        -- again (the next pick starts at the next queue).
        IF v_count = 0 THEN
            IF v_q_slot AND v_i < v_n - 1 THEN
                RETURN QUERY SELECT NULL::bigint, v_q, NULL::text, NULL::text,
                                    NULL::jsonb, NULL::integer, NULL::integer, NULL::boolean;
                RETURN;
            END IF;
            v_limit := v_limit0;
            v_batch := v_batch0;
        ELSIF v_q_slot THEN
            -- The queues after it get what the lane asked for.
            v_limit := greatest(v_limit0, v_count);
        END IF;
    END LOOP;
    -- A pick that took all it could may have left other work ready: look
    -- (without locks; a ready group that another runner holds counts too).
    -- Jobs taken or held by the caller's lanes are not left work: at a few
    -- hundred jobs a second, counting them sent most lanes to pick again
    -- after every job, to find nothing.
    v_more := v_more OR v_slot_left;
    IF v_count >= v_limit AND NOT v_more THEN
        v_ids := v_ids || coalesce(array_remove(p_held, NULL), '{}');
        v_more := EXISTS (SELECT 1 FROM pgfifo.queue_group AS g
                          WHERE g.queue = ANY (p_queues) AND g.ready_at IS NOT NULL
                            AND g.ready_at <= v_now AND g.ready_at > '-infinity'
                            AND NOT g.head_id = ANY (v_ids) /*@dist AND g.part = ANY (p_parts) */)
               OR EXISTS (SELECT 1 FROM pgfifo.job AS j
                          WHERE j.queue = ANY (p_queues) AND j.group_id IS NULL
                            AND j.state = 'queued' AND j.run_after <= v_now
                            AND NOT j.id = ANY (v_ids) /*@dist AND j.part = ANY (p_parts) */);
    END IF;
    -- Followers: only when no other work was left ready (see above).
    -- Each candidate is read without a lock, in a statement whose snapshot
    -- is taken after the group's lock, then locked by key; the first that
    -- cannot be taken ends its group's followers (none may be skipped).
    -- (Not after a lane without a free permit left groups whose turn it
    -- was not: they wait, and their competitors' next jobs must too.)
    IF NOT v_more AND NOT v_declined AND v_count < v_batch AND cardinality(v_follow) > 0 THEN
        v_heads := v_count;
        <<follow>>
        FOR v_i IN 1 .. v_heads LOOP
            v_lead := v_jobs[v_i];
            CONTINUE WHEN NOT v_lead.id = ANY (v_follow);
            FOR v_f IN
                SELECT j.id FROM pgfifo.job AS j
                WHERE j.queue = v_lead.queue AND j.group_id = v_lead.group_id
                  AND j.state = 'queued' AND j.id > v_lead.id /*@dist AND j.part = v_lead.part */
                ORDER BY j.id LIMIT v_batch - v_count
            LOOP
                SELECT * INTO v_job FROM pgfifo.job AS j
                WHERE j.id = v_f.id AND j.state = 'queued' AND j.run_after <= v_now
                  AND j.priority = v_lead.priority /*@dist AND j.part = v_lead.part */
                FOR UPDATE SKIP LOCKED;
                EXIT WHEN NOT FOUND;
                v_jobs := v_jobs || v_job;
                v_slots := v_slots || v_slots[v_i];
                v_ids := v_ids || v_job.id;
                v_count := v_count + 1;
            END LOOP;
            EXIT follow WHEN v_count >= v_batch;
        END LOOP;
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

-- The W3C trace context stored with job p_id at its enqueue (table
-- pgfifo.job_trace, docs/tracing.md), as {traceparent, tracestate}; NULL
-- without one, and after `migrate down` past 0009_trace_context. The
-- runner's pick statement reads it per job with the `otel` feature. A
-- function, not a subquery of that statement: its query takes its own
-- snapshot (the statement's predates the jobs pick locks), and in the
-- distributed layout it looks on the shard of this transaction's pick
-- (from a variable: Citus routes a statement by its part only when the
-- part is a constant or a parameter).
CREATE OR REPLACE FUNCTION pgfifo.job_trace_context(p_id bigint) RETURNS text[]
LANGUAGE plpgsql VOLATILE
AS $$
/*@dist DECLARE v_parts integer[] := nullif(current_setting('pgfifo.pick_parts', true), '')::integer[]; */
BEGIN
    IF to_regclass('pgfifo.job_trace') IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN (SELECT ARRAY[t.traceparent, t.tracestate] FROM pgfifo.job_trace AS t
            WHERE t.job_id = p_id /*@dist AND t.part = ANY (v_parts) */);
END
$$;

-- The distributed layout's pick (docs/scaling.md): the function above,
-- installed there as pgfifo.pick_in with the parts of one shard as its
-- first argument (every statement it runs on the groups' and jobs' tables
-- then names parts of that shard, so Citus routes each to it). It first
-- tries the shard where this session's turn points and the two after it;
-- when they give nothing, one read of every shard (in parallel, on their
-- ready indexes) says which others have a ready group or ungrouped job,
-- and it tries those in turn order until one gives something. So a busy
-- runner's pick touches a shard or three; a session whose last pick was
-- empty reads first which shards have work, so an idle lane's poll costs
-- that one read. The shard it took jobs from stays in the
-- transaction's setting pgfifo.pick_parts, for the completion of its
-- jobs. Every job row says `more`: other shards may have work that this
-- pick did not look at. Where one of several queues has a concurrency
-- limit, a shard's visit that gives nothing is rolled back (a
-- subtransaction): the queue slot it took (the row, its advisory lock, the
-- setting) must not stay held while the pick goes on to other shards and
-- other queues' jobs. (With one queue, a later visit takes that queue's
-- jobs under the same slot, as one server's pick would; and Citus sends
-- each subtransaction's savepoints to the workers, which halved the
-- drain of a limited queue.)
/*@dist
CREATE OR REPLACE FUNCTION pgfifo.pick(
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
-- Its read of every shard runs on one connection per worker: tiny reads,
-- for which Citus would otherwise open connections in parallel and close
-- them at the transaction's end, on every poll of every lane.
SET citus.max_adaptive_executor_pool_size = 1
AS $$
DECLARE
    v_shards integer := (SELECT count(*) FROM pgfifo.layout_shard);
    v_start  integer := ((p_turn::bigint & 2147483647) + pg_backend_pid()) % greatest(v_shards, 1);
    v_parts  integer[];
    v_ready  integer[];
    v_now    timestamptz := statement_timestamp();
    v_idle   boolean := coalesce(current_setting('pgfifo.pick_idle', true), '') = 'on';
    v_slots  boolean := cardinality(p_queues) > 1
                        AND EXISTS (SELECT 1 FROM pgfifo.queue_control AS c
                                    WHERE c.queue = ANY (p_queues) AND c.concurrency IS NOT NULL);
    v_found  boolean;
BEGIN
    -- Pass 0: the turn's shard and the two after it. Pass 1: of the rest,
    -- those a read of every shard says have ready work. After an empty
    -- pick of this session (the session setting pgfifo.pick_idle), that
    -- read comes first and both passes try only the shards it names: an
    -- idle lane's poll is then that one read.
    FOR v_pass IN 0 .. 1 LOOP
        IF v_ready IS NULL AND (v_pass = 1 OR v_idle) THEN
            v_ready := ARRAY(SELECT g.part FROM pgfifo.queue_group AS g
                             WHERE g.queue = ANY (p_queues) AND g.ready_at IS NOT NULL
                               AND g.ready_at <= v_now
                             UNION
                             SELECT j.part FROM pgfifo.job AS j
                             WHERE j.queue = ANY (p_queues) AND j.group_id IS NULL
                               AND j.state = 'queued' AND j.run_after <= v_now);
        END IF;
        FOR v_parts IN
            SELECT s.parts FROM pgfifo.layout_shard AS s
            WHERE CASE WHEN v_pass = 0 THEN (s.shard - v_start + v_shards) % v_shards < 3
                                            AND (NOT v_idle OR s.parts && v_ready)
                       ELSE (s.shard - v_start + v_shards) % v_shards >= 3
                            AND s.parts && v_ready END
            ORDER BY (s.shard - v_start + v_shards) % v_shards
        LOOP
            IF NOT v_slots THEN
                RETURN QUERY
                SELECT p.id, p.queue, p.group_id, p.kind, p.payload, p.max_attempts, p.slot,
                       p.id IS NOT NULL
                FROM pgfifo.pick_in(v_parts, p_queues, p_turn, p_slot, p_kinds, p_idle_ms,
                                    p_default_idle_ms, p_limit, p_held) AS p;
                v_found := FOUND;
            ELSE
                v_found := false;
                BEGIN
                    RETURN QUERY
                    SELECT p.id, p.queue, p.group_id, p.kind, p.payload, p.max_attempts, p.slot,
                           p.id IS NOT NULL
                    FROM pgfifo.pick_in(v_parts, p_queues, p_turn, p_slot, p_kinds, p_idle_ms,
                                        p_default_idle_ms, p_limit, p_held) AS p;
                    v_found := FOUND;
                    IF NOT v_found THEN
                        RAISE SQLSTATE 'PF002'; -- undo the visit: its queue slot goes back
                    END IF;
                EXCEPTION WHEN SQLSTATE 'PF002' THEN
                    NULL;
                END;
            END IF;
            IF v_found THEN
                PERFORM set_config('pgfifo.pick_parts', v_parts::text, true);
                IF v_idle THEN
                    PERFORM set_config('pgfifo.pick_idle', 'off', false);
                END IF;
                RETURN;
            END IF;
        END LOOP;
    END LOOP;
    IF NOT v_idle THEN
        PERFORM set_config('pgfifo.pick_idle', 'on', false);
    END IF;
END
$$;
*/

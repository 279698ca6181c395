-- One group as an operator's listing shows it (admin::groups, the
-- dashboard): its head, why it waits, its backlog and limits.
--
-- Installed whole by `migrate` (CREATE OR REPLACE) after the numbered
-- migrations; see crates/pgfifo/src/migrate.rs and docs/upgrading.md for
-- how a change of arguments or result type is made.
--
-- The plain layout's listings read these columns in one statement over
-- all the groups they list (crates/pgfifo/src/db/admin/group_list.rs). On the
-- distributed layout, Citus refuses that statement (its joins are not all
-- on the part, and it has correlated subqueries beside a subquery in FROM),
-- so the listing chooses its groups first and reads each here: there
-- every statement names the group's part, so each runs whole on the
-- group's shard. (The plain layout can call it too: the tests compare it
-- with the plain statement.) Its columns are those of the plain statement, with the same
-- meanings (see GroupRow there).
CREATE OR REPLACE FUNCTION pgfifo.group_row(
    p_queue               text,
    p_group               text,
    OUT group_id          text,
    OUT head_id           bigint,
    OUT head_state        text,
    OUT active            boolean,
    OUT waiting           boolean,
    OUT ready_at_us       bigint,
    OUT head_attempts     integer,
    OUT head_max_attempts integer,
    OUT head_started      boolean,
    OUT head_age_us       bigint,
    OUT head_error        text,
    OUT paused_at_us      bigint,
    OUT backlog           bigint,
    OUT snoozed_until_us  bigint,
    OUT rate_count        integer,
    OUT rate_period_ms    bigint,
    OUT burst             integer,
    OUT tokens            double precision,
    OUT concurrency       integer,
    OUT weight            integer,
    OUT running           bigint,
    OUT own_limits        boolean
)
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    /*@dist v_part integer := pgfifo.part_of(p_queue, p_group); */
    l record;
BEGIN
    SELECT * INTO l FROM pgfifo.group_limits(p_queue, p_group);
    rate_count := l.rate_count;
    rate_period_ms := l.rate_period_ms;
    burst := l.burst;
    concurrency := l.concurrency;
    weight := l.weight;
    -- (pgfifo.group_tokens, with the limits read above.)
    IF l.rate_count IS NOT NULL THEN
        tokens := pgfifo.bucket_tokens(p_queue, p_group, now(), l.rate_count,
                                       l.rate_period_ms, l.burst);
    END IF;
    group_id := p_group;
    SELECT g.head_id, j.state,
           g.ready_at IS NOT NULL,
           coalesce(g.ready_at > now(), false),
           (extract(epoch FROM CASE WHEN isfinite(g.ready_at) THEN g.ready_at END) * 1e6)::bigint,
           j.attempts, j.max_attempts,
           (extract(epoch FROM now() - j.created_at) * 1e6)::bigint,
           j.last_error
    INTO head_id, head_state, active, waiting, ready_at_us, head_attempts, head_max_attempts,
         head_age_us, head_error
    FROM pgfifo.queue_group AS g
    LEFT JOIN pgfifo.job AS j ON /*@dist j.part = g.part AND */ j.id = g.head_id
    WHERE /*@dist g.part = v_part AND */ g.queue = p_queue AND g.group_id = p_group;
    active := coalesce(active, false);
    waiting := coalesce(waiting, false);
    head_started := coalesce(head_state = 'queued' AND EXISTS (
        SELECT 1 FROM pgfifo.job_attempt AS a
        WHERE /*@dist a.part = v_part AND */ a.job_id = head_id AND a.attempt > head_attempts), false);
    SELECT (extract(epoch FROM p.paused_at) * 1e6)::bigint INTO paused_at_us
    FROM pgfifo.group_pause AS p
    WHERE /*@dist p.part = v_part AND */ p.queue = p_queue AND p.group_id = p_group;
    SELECT count(*) INTO backlog
    FROM pgfifo.job AS b
    WHERE /*@dist b.part = v_part AND */ b.queue = p_queue AND b.group_id = p_group AND b.state = 'queued';
    SELECT (extract(epoch FROM z.until) * 1e6)::bigint INTO snoozed_until_us
    FROM pgfifo.group_snooze AS z
    WHERE /*@dist z.part = v_part AND */ z.queue = p_queue AND z.group_id = p_group AND z.until > now()
      AND z.job_id = head_id;
    SELECT count(*) INTO running
    FROM (SELECT b.id, b.attempts FROM pgfifo.job AS b
          WHERE /*@dist b.part = v_part AND */ b.queue = p_queue AND b.group_id = p_group
            AND b.state = 'queued'
          ORDER BY b.id LIMIT 2 * concurrency) AS b
    WHERE EXISTS (SELECT 1 FROM pgfifo.job_attempt AS a
                  WHERE /*@dist a.part = v_part AND */ a.job_id = b.id AND a.attempt > b.attempts);
    own_limits := EXISTS (SELECT 1 FROM pgfifo.group_control AS c
                          WHERE c.queue = p_queue AND c.group_id = p_group);
END
$$;

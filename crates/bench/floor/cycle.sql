-- The bare server work of one job, for `floor.sh`: not pgfifo's SQL (that is
-- in crates/pgfifo/src/db/), but the least that its protocol sends per job,
-- written as plain statements on pgfifo's schema with none of its features
-- (no PL/pgSQL, no priorities, pauses, controls, unique keys, failure
-- policies, idle bound, advisory lock, `more`, followers).
--
-- One pgbench transaction is one job: the enqueue (autocommit, into an idle
-- group, made active in the same statement, with its notification); the
-- pick with BEGIN and the handlers' savepoint in one round trip; the
-- savepoint's release, the outcome, the group's next head and COMMIT in one
-- round trip. The attempt record, which pgfifo commits apart from the job,
-- on another connection, is `attempt.sql`.
\set n random(0, 199)
WITH j AS (
    INSERT INTO pgfifo.job (queue, group_id, kind, payload, max_attempts)
    VALUES ('floor', 'g' || :n, 'k', '{"n": 1}', 3)
    RETURNING id, group_id, run_after
), activated AS (
    UPDATE pgfifo.queue_group AS g
    SET head_id = j.id, ready_at = j.run_after, idle_since = NULL
    FROM j
    WHERE g.queue = 'floor' AND g.group_id = j.group_id AND g.head_id IS NULL
    RETURNING 1
)
SELECT pg_notify('pgfifo_floor', '') FROM activated;
\startpipeline
BEGIN;
SELECT set_config('pgfifo_floor.job', p.id::text, true), p.payload
FROM (
    SELECT j.id, j.payload
    FROM pgfifo.queue_group AS g
    JOIN pgfifo.job AS j ON j.id = g.head_id
    WHERE g.queue = 'floor' AND g.ready_at IS NOT NULL AND g.ready_at <= now()
    ORDER BY g.priority DESC, g.slot
    LIMIT 1
    FOR UPDATE OF g, j SKIP LOCKED
) AS p;
SAVEPOINT handler;
\endpipeline
\startpipeline
RELEASE SAVEPOINT handler;
WITH done AS (
    UPDATE pgfifo.job
    SET state = 'succeeded', attempts = 1, finished_at = now()
    WHERE id = current_setting('pgfifo_floor.job')::bigint
    RETURNING id, queue, group_id
), next AS (
    SELECT j.id, j.run_after
    FROM pgfifo.job AS j, done
    WHERE j.queue = done.queue AND j.group_id = done.group_id AND j.state = 'queued'
      AND j.id <> done.id
    ORDER BY j.id
    LIMIT 1
)
UPDATE pgfifo.queue_group AS g
SET head_id = (SELECT id FROM next), ready_at = (SELECT run_after FROM next),
    idle_since = CASE WHEN EXISTS (SELECT 1 FROM next) THEN NULL ELSE now() END
FROM done
WHERE g.queue = done.queue AND g.group_id = done.group_id;
COMMIT;
\endpipeline

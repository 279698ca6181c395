-- Dependencies, for others: the SQL API's pgfifo.add_job_after and the
-- admin views' pgfifo.dependency_waits. The machinery is in
-- 18_dependencies.sql; see docs/batches.md ("Dependencies").
--
-- Installed whole by `migrate` (CREATE OR REPLACE) after the numbered
-- migrations; see crates/pgfifo/src/migrate.rs and docs/upgrading.md for
-- how a change of arguments or result type is made.

-- The SQL API for producers in other languages (docs/enqueue-from-sql.md):
-- one job, as pgfifo.add_job takes it (checked by the same rules, with the
-- same errors), that waits for the jobs depends_on and the batches
-- after_batches to succeed; on_dependency_failure is 'cancel' (the
-- default), 'hold' or 'run'. Without any dependency it is add_job's
-- enqueue. Errors of the dependencies as enqueue_after's.
-- STABLE like add_job: its signature is a public interface.
CREATE OR REPLACE FUNCTION pgfifo.add_job_after(
    kind                  text,
    queue                 text,
    payload               jsonb,
    depends_on            bigint[]    DEFAULT NULL,
    after_batches         bigint[]    DEFAULT NULL,
    on_dependency_failure text        DEFAULT 'cancel',
    group_id              text        DEFAULT NULL,
    run_at                timestamptz DEFAULT NULL,
    delay                 interval    DEFAULT NULL,
    priority              integer     DEFAULT NULL,
    max_attempts          integer     DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v       record;
    v_jobs  bigint[] := coalesce(add_job_after.depends_on, '{}');
    v_bats  bigint[] := coalesce(add_job_after.after_batches, '{}');
    v_nj    integer;
    v_nb    integer;
BEGIN
    /*@dist PERFORM pgfifo.not_distributed('dependencies'); */
    SELECT * INTO v
    FROM pgfifo.add_job_checked('', add_job_after.kind, add_job_after.queue, add_job_after.payload,
                                add_job_after.group_id, add_job_after.run_at, add_job_after.delay,
                                add_job_after.priority, NULL, add_job_after.max_attempts);
    v_nj := cardinality(v_jobs);
    v_nb := cardinality(v_bats);
    RETURN (pgfifo.enqueue_after(
        ARRAY[add_job_after.queue], ARRAY[add_job_after.group_id], ARRAY[add_job_after.kind],
        ARRAY[add_job_after.payload], ARRAY[v.priority], ARRAY[v.max_attempts],
        ARRAY[v.run_at_us], ARRAY[v.delay_us], ARRAY[add_job_after.on_dependency_failure],
        array_fill(1, ARRAY[v_nj + v_nb]),
        v_jobs || array_fill(NULL::bigint, ARRAY[v_nb]),
        array_fill(NULL::bigint, ARRAY[v_nj]) || v_bats))[1];
END
$$;

-- Why the jobs p_jobs wait, for the admin views: one row per waiting
-- dependent among them, with its policy, the jobs and batches it still
-- waits for (ascending), and, when held, the failed dependency that holds
-- it (still failed now). Read-only.
CREATE OR REPLACE FUNCTION pgfifo.dependency_waits(p_jobs bigint[])
RETURNS TABLE (job_id bigint, on_failure text, jobs bigint[], batches bigint[],
               held_by_job bigint, held_by_batch bigint)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
    SELECT w.job_id, w.on_failure,
           coalesce(ARRAY(SELECT d.dep_job_id FROM pgfifo.job_dependency AS d
                          WHERE d.job_id = w.job_id AND NOT d.satisfied AND d.dep_job_id IS NOT NULL
                          ORDER BY 1), '{}'),
           coalesce(ARRAY(SELECT d.dep_batch_id FROM pgfifo.job_dependency AS d
                          WHERE d.job_id = w.job_id AND NOT d.satisfied AND d.dep_batch_id IS NOT NULL
                          ORDER BY 1), '{}'),
           CASE WHEN pgfifo.dependency_state(w.blocked_by_job, NULL) = 'failed' THEN w.blocked_by_job END,
           CASE WHEN pgfifo.dependency_state(NULL, w.blocked_by_batch) = 'failed' THEN w.blocked_by_batch END
    FROM pgfifo.job_wait AS w
    WHERE w.job_id = ANY (p_jobs)
    ORDER BY w.job_id;
END
$$;

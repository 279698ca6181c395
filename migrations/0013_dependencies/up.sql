-- 0013_dependencies: jobs that wait for other jobs or for batches
-- (docs/batches.md, "Dependencies").
--
-- A dependent job is enqueued like a delayed job whose time never comes
-- (run_after = pgfifo.dependency_wait_at(), a fixed far future): it holds
-- its group as a delayed head does, and the jobs enqueued after it in its
-- group wait behind it. When its dependencies have all succeeded it is
-- released: run_after becomes its own start time (now, unless it asked for
-- a later one) and its group is woken through pgfifo.group_wake, as an
-- enqueue wakes it. When one fails for good, is cancelled or skipped (a
-- batch: completes without success), the dependent's on_failure decides.
--
-- Tables of their own, not columns of pgfifo.job (adding one there waits
-- for every running job, see 0007_long_runs). Both hold rows only while a
-- dependent waits: the release (or the cancel) deletes them, so they stay
-- empty where nobody uses dependencies, and the hook in complete is one
-- probe of an empty table.

-- One edge per dependency of a waiting job: on a job (dep_job_id) or on a
-- batch (dep_batch_id). satisfied: the dependency counted as done (it
-- succeeded, or it failed and the dependent's policy is 'run'); once set it
-- stays, so that a dependency that failed and is retried later counts once.
CREATE TABLE pgfifo.job_dependency (
    job_id       bigint  NOT NULL,
    dep_job_id   bigint,
    dep_batch_id bigint,
    satisfied    boolean NOT NULL DEFAULT false,
    CHECK ((dep_job_id IS NULL) <> (dep_batch_id IS NULL))
);
CREATE INDEX job_dependency_job_idx ON pgfifo.job_dependency (job_id);
CREATE INDEX job_dependency_dep_job_idx ON pgfifo.job_dependency (dep_job_id)
    WHERE dep_job_id IS NOT NULL;
CREATE INDEX job_dependency_dep_batch_idx ON pgfifo.job_dependency (dep_batch_id)
    WHERE dep_batch_id IS NOT NULL;

-- One row per waiting dependent. on_failure: what a dependency that fails
-- for good does to it ('cancel': it is cancelled, and its own dependents
-- after it; 'hold': it keeps waiting, blocked_by_* saying by which
-- dependency, until an operator retries that one or cancels this one;
-- 'run': the dependency counts as done). run_after: the start time the job
-- asked for (NULL: none), applied when it is released.
CREATE TABLE pgfifo.job_wait (
    job_id           bigint      PRIMARY KEY,
    on_failure       text        NOT NULL CHECK (on_failure IN ('cancel', 'hold', 'run')),
    blocked_by_job   bigint,
    blocked_by_batch bigint,
    run_after        timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now()
);

-- 0007_long_runs: jobs of types in long mode (`#[job(long)]`) run without
-- an open transaction.
--
-- A long run is a committed row here, written by the transaction that
-- picked the job, plus a session-level advisory lock that the runner's
-- connection holds for the whole run (pgfifo.claim_long_run). The row says
-- that the job's group is busy and who holds it; the lock says whether
-- that holder's session is still alive: it is released the moment the
-- session ends, and a pick that finds the lock free deletes the row and
-- runs the job again (pgfifo.long_run_free). `token` fences the completion:
-- only the transaction that deletes the row with its token may write the
-- job's outcome. `lease_until` is renewed by the holder while its process
-- runs; past it, a pick ends the holder's session (a frozen worker).
--
-- A table of its own, not columns of job or queue_group: adding columns
-- there would wait for every running job.
CREATE TABLE pgfifo.job_run (
    job_id      bigint      PRIMARY KEY,
    queue       text        COLLATE "C" NOT NULL,
    -- NULL: an ungrouped job (it holds only itself).
    group_id    text        COLLATE "C",
    token       bigint      NOT NULL,
    -- The second key of the advisory lock (class 0x7067666c), and the
    -- holder's backend: who may be ended when the lease has passed.
    lock_key    integer     NOT NULL,
    pid         integer     NOT NULL,
    runner      text        NOT NULL,
    attempt     integer     NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    lease_until timestamptz NOT NULL
);
-- A group has at most one long run (NULLs, ungrouped jobs, are distinct).
CREATE UNIQUE INDEX job_run_group_idx ON pgfifo.job_run (queue, group_id);

CREATE SEQUENCE pgfifo.job_run_token_seq;

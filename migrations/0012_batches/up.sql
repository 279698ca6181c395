-- 0012_batches: batches of jobs with callbacks (docs/batches.md).
--
-- A batch counts the terminal outcomes of its jobs and enqueues callback
-- jobs when they decide an event: 'failure' (a job failed for good),
-- 'complete' (every job has a terminal outcome) and 'success' (every job
-- succeeded). The callbacks' job ids are written with the batch's row
-- locked, in the transaction that writes the deciding outcome: each
-- callback is enqueued at most once, and with the outcome or not at all.
--
-- The counts live in up to 64 shards (pgfifo.batch_shard), so that
-- runners ending jobs of one batch at the same moment update different
-- rows: one row for all would serialize every completion of the batch
-- behind the previous one's commit (measured: 3.4 times the drain time for
-- 10,000 jobs on 16 lanes). The batch's row is locked only when a shard
-- runs out of jobs (at most 64 times, plus once per reopened shard), at
-- the batch's first failure, and when jobs are added or it is closed.
--
-- Tables of their own, not columns of pgfifo.job: adding a column there
-- would wait for every running job (see 0007_long_runs), and they stay
-- empty where nobody uses batches.
CREATE TABLE pgfifo.batch (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    description     text        CHECK (octet_length(description) <= 1024),
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- NULL while jobs may still be added (an open batch never completes).
    closed_at       timestamptz,
    -- When every job first had a terminal outcome (the 'complete' event).
    completed_at    timestamptz,
    -- When a job first failed for good (the 'failure' event).
    first_failed_at timestamptz,
    -- How many jobs the batch has.
    total           integer     NOT NULL DEFAULT 0 CHECK (total >= 0),
    -- Its shard rows, and how many of them have no job left to end: the
    -- batch is done when the two are equal.
    shards          integer     NOT NULL DEFAULT 0 CHECK (shards >= 0),
    shards_done     integer     NOT NULL DEFAULT 0 CHECK (shards_done >= 0 AND shards_done <= shards)
);

-- A share of a batch's counts: how many of its jobs without a terminal
-- outcome the shard holds (a number, not which jobs), and how many ended
-- each way. A failed job that an operator retries leaves 'failed' and is
-- remaining again until it ends again. A skipped head counts as failed
-- (its state is 'failed').
CREATE TABLE pgfifo.batch_shard (
    batch_id  bigint   NOT NULL REFERENCES pgfifo.batch (id) ON DELETE CASCADE,
    shard     smallint NOT NULL CHECK (shard >= 0 AND shard < 64),
    remaining integer  NOT NULL DEFAULT 0 CHECK (remaining >= 0),
    -- (Any shard may count any job's outcome: only the sums mean
    -- something.)
    succeeded integer  NOT NULL DEFAULT 0,
    failed    integer  NOT NULL DEFAULT 0,
    cancelled integer  NOT NULL DEFAULT 0,
    PRIMARY KEY (batch_id, shard)
);

-- The batch of a job (a job belongs to one batch at most).
CREATE TABLE pgfifo.batch_job (
    job_id   bigint PRIMARY KEY,
    batch_id bigint NOT NULL REFERENCES pgfifo.batch (id) ON DELETE CASCADE
);
CREATE INDEX batch_job_batch_idx ON pgfifo.batch_job (batch_id);

-- A batch's callbacks, one per event at most: the job to enqueue when the
-- event happens (the arguments of pgfifo.enqueue), and its id once it is
-- enqueued (never set twice).
CREATE TABLE pgfifo.batch_callback (
    batch_id     bigint   NOT NULL REFERENCES pgfifo.batch (id) ON DELETE CASCADE,
    event        text     NOT NULL CHECK (event IN ('success', 'complete', 'failure')),
    queue        text     COLLATE "C" NOT NULL,
    group_id     text     COLLATE "C",
    kind         text     NOT NULL,
    payload      jsonb    NOT NULL,
    priority     smallint NOT NULL,
    max_attempts integer  NOT NULL CHECK (max_attempts > 0),
    job_id       bigint,
    PRIMARY KEY (batch_id, event)
);
-- A callback's handler finds its batch by its own job id.
CREATE INDEX batch_callback_job_idx ON pgfifo.batch_callback (job_id) WHERE job_id IS NOT NULL;

-- 0006_group_controls: concurrency, rate limits and weights per group, and
-- snooze.
--
-- A group's concurrency is how many of its jobs may run at once (default
-- 1). With more than one, each running job holds one of the group's slot
-- rows (pgfifo.group_slot) instead of the group row; see pick.
--
-- A group's weight is its share of the runners' turns among groups with
-- backlog (default 1).
--
-- A group's rate limit is a token bucket: `burst` tokens at most, refilled
-- at `rate_count` per `rate_period_ms`; each start of one of its jobs takes
-- a token, and the group waits (its ready_at) for the next token when none
-- is left. Limits are rows of pgfifo.group_control: the row whose group_id
-- is '' holds a queue's defaults (no group has an empty name), a row with a
-- group's name overrides them column by column (NULL: the default).
CREATE TABLE pgfifo.group_control (
    queue          text        COLLATE "C" NOT NULL,
    group_id       text        COLLATE "C" NOT NULL,
    rate_count     integer     CHECK (rate_count BETWEEN 1 AND 1000000),
    rate_period_ms bigint      CHECK (rate_period_ms BETWEEN 1 AND 31622400000),
    burst          integer     CHECK (burst BETWEEN 1 AND 1000000),
    concurrency    integer     CHECK (concurrency BETWEEN 1 AND 1000),
    weight         integer     CHECK (weight BETWEEN 1 AND 1000),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, group_id),
    CHECK ((rate_count IS NULL) = (rate_period_ms IS NULL))
);

-- The tokens of each rate-limited group, as of `at`. Written when one of its
-- jobs starts, in the transaction that records the attempt (committed before
-- the handler runs, outside the job's transaction), so a start counts even
-- if its runner dies. A group without a row has a full bucket.
CREATE TABLE pgfifo.group_bucket (
    queue    text             COLLATE "C" NOT NULL,
    group_id text             COLLATE "C" NOT NULL,
    tokens   double precision NOT NULL,
    at       timestamptz      NOT NULL,
    PRIMARY KEY (queue, group_id)
) WITH (fillfactor = 70);

-- The slots of groups whose concurrency is above 1: rows 0 .. N-1 of a
-- group, each locked FOR UPDATE by the transaction of a job that runs in
-- it, for the job's whole run (a crash releases it with the transaction).
-- Created outside jobs' transactions (set_group_control, promote), never by
-- a pick. Slots above a group's concurrency are left unused.
CREATE TABLE pgfifo.group_slot (
    queue    text     COLLATE "C" NOT NULL,
    group_id text     COLLATE "C" NOT NULL,
    slot     smallint NOT NULL CHECK (slot BETWEEN 0 AND 999),
    PRIMARY KEY (queue, group_id, slot)
);

-- A snoozed group: its head asked to wait until `until` without using an
-- attempt (JobError::snooze), for status. The wait itself is the group's
-- ready_at and the head's run_after; a row whose time has passed, or whose
-- job is no longer the head, says nothing. A table of its own, not columns
-- of queue_group: adding columns there would wait for every running job.
CREATE TABLE pgfifo.group_snooze (
    queue    text        COLLATE "C" NOT NULL,
    group_id text        COLLATE "C" NOT NULL,
    until    timestamptz NOT NULL,
    job_id   bigint      NOT NULL,
    PRIMARY KEY (queue, group_id)
);

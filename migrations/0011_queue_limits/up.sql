-- 0011_queue_limits: limits of a whole queue, across all its groups and
-- runners: how many of its jobs may run at once, and a token bucket for
-- its starts. They add to the groups' own limits (migration 0006): a start
-- needs a slot and a token from both.
--
-- A queue's limits are one row of pgfifo.queue_control; a queue without a
-- row has none (and its runners do no extra work for it). rate_count starts
-- per rate_period_ms, at most burst at once (default: rate_count).
CREATE TABLE pgfifo.queue_control (
    queue          text        COLLATE "C" PRIMARY KEY,
    concurrency    integer     CHECK (concurrency BETWEEN 1 AND 10000),
    rate_count     integer     CHECK (rate_count BETWEEN 1 AND 1000000),
    rate_period_ms bigint      CHECK (rate_period_ms BETWEEN 1 AND 31622400000),
    burst          integer     CHECK (burst BETWEEN 1 AND 1000000),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    CHECK ((rate_count IS NULL) = (rate_period_ms IS NULL))
);

-- The slots of queues with a concurrency: rows 0 .. N-1 of a queue, each
-- locked FOR UPDATE by the job transaction of a runner's lane that runs
-- jobs of the queue, for as long as it runs them (its jobs run one after
-- another: one slot per lane). A crash or a lost connection ends the
-- transaction and frees the slot. Created by pgfifo.change_queue_control,
-- never by a pick; slots at or above the concurrency are left unused.
CREATE TABLE pgfifo.queue_slot (
    queue text    COLLATE "C" NOT NULL,
    slot  integer NOT NULL CHECK (slot BETWEEN 0 AND 9999),
    PRIMARY KEY (queue, slot)
);

-- The tokens of each rate-limited queue, as of `at`. Written when one of
-- its jobs starts, in the transaction that records the attempt (before the
-- handler runs, outside the job's transaction), like pgfifo.group_bucket.
-- A queue without a row has a full bucket.
CREATE TABLE pgfifo.queue_bucket (
    queue  text             COLLATE "C" PRIMARY KEY,
    tokens double precision NOT NULL,
    at     timestamptz      NOT NULL
) WITH (fillfactor = 70);

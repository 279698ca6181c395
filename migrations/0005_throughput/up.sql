-- 0005_throughput: jobs finished per queue and minute, for the dashboard's
-- chart of the last hour.
--
-- Runners add what they committed since their last heartbeat to the row of
-- the current minute (one upsert per queue and heartbeat, off the jobs' hot
-- path), and delete rows older than two hours as they go. A runner that
-- dies loses at most one heartbeat's counts; runners of 0.1.0 record
-- nothing.
CREATE TABLE pgfifo.queue_minute (
    queue     text        COLLATE "C" NOT NULL,
    minute    timestamptz NOT NULL,
    succeeded bigint      NOT NULL DEFAULT 0,
    failed    bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, minute)
);

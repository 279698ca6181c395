-- 0010_dedup_windows: de-duplication windows per key (docs/dedup-windows.md).
--
-- One row per (queue, key) that a window holds: the job it points at, the
-- window's mode and when it ends. The row is the key's lock: a producer
-- inserts it, or updates an expired one, with INSERT ... ON CONFLICT, so two
-- producers of one key are serialized by the row (the second waits for the
-- first's commit or rollback) and exactly one of them creates a job.
--
--   mode 'unique':   until = enqueue time + period (sliding from the job);
--   mode 'throttle': until = the end of the period-aligned slot the job
--                    was enqueued in;
--   mode 'debounce': until = the job's start time (now + quiet period); the
--                    key holds as long as its job is queued and not locked
--                    by a runner, whatever until says.
-- period is the window's length as the producer gave it, kept for display.
-- Rows whose window ended are deleted by retention (pgfifo.clean_windows).
CREATE TABLE pgfifo.job_window (
    queue      text        COLLATE "C" NOT NULL,
    key        text        COLLATE "C" NOT NULL,
    mode       text        NOT NULL CHECK (mode IN ('unique', 'debounce', 'throttle')),
    job_id     bigint      NOT NULL,
    period     interval    NOT NULL CHECK (period > interval '0'),
    until      timestamptz NOT NULL,
    PRIMARY KEY (queue, key)
);

-- The CLI's job view: which key and window a job carries.
CREATE INDEX job_window_job_idx ON pgfifo.job_window (job_id);

-- The SQL API's add_job gets the window as trailing optional parameters: the
-- new signature replaces the one of 0008's time (both unreleased, 0.3.0), so
-- that calls by name or position resolve to exactly one function.
DROP FUNCTION IF EXISTS pgfifo.add_job(text, text, jsonb, text, timestamptz, interval, integer, text, integer);
DROP FUNCTION IF EXISTS pgfifo.add_job(text, text, jsonb, text, timestamptz, interval, integer, text, integer, text, text);

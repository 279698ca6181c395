-- pgfifo schema, version 4 (pgfifo 0.2.0): recurring jobs.
--
-- A schedule is declared in code (RunnerConfig::schedule) and stored here by
-- the runners that declare it. A runner fires a tick by locking the
-- schedule's row, enqueueing the tick's job and moving `fired_through` past
-- the tick, all in one transaction; `schedule_tick`'s primary key makes a
-- second firing of the same tick impossible even if that protocol were
-- broken. See docs/recurring-jobs.md.

CREATE TABLE pgfifo.schedule (
    name          text        PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 200),
    -- The cron expression and IANA time zone it is read in.
    expression    text        NOT NULL,
    time_zone     text        NOT NULL,
    -- Where its jobs go.
    kind          text        NOT NULL,
    queue         text        NOT NULL,
    group_id      text,
    -- What happens to ticks that passed while no runner fired them:
    -- 'skip', 'once' or 'each' (each up to max_catch_up).
    missed        text        NOT NULL CHECK (missed IN ('skip', 'once', 'each')),
    max_catch_up  integer     NOT NULL CHECK (max_catch_up >= 1),
    -- The whole definition as declared, compared as a value: a runner fires
    -- a schedule only while this equals its own declaration.
    definition    jsonb       NOT NULL,
    -- Every tick at or before this instant has been dealt with (fired,
    -- caught up or skipped).
    fired_through timestamptz NOT NULL,
    paused        boolean     NOT NULL DEFAULT false,
    -- The latest tick fired, and its job.
    last_tick     timestamptz,
    last_job_id   bigint,
    last_fired_at timestamptz,
    -- Due ticks that were not fired one by one (skipped or folded into one
    -- job by the missed-tick policy), in total.
    missed_ticks  bigint      NOT NULL DEFAULT 0,
    declared_at   timestamptz NOT NULL DEFAULT now(),
    declared_by   text        NOT NULL
);

-- One row per fired tick: the key that makes each tick fire once. Only the
-- most recent ticks of each schedule are kept.
CREATE TABLE pgfifo.schedule_tick (
    schedule text        NOT NULL REFERENCES pgfifo.schedule (name) ON DELETE CASCADE,
    tick     timestamptz NOT NULL,
    job_id   bigint      NOT NULL,
    fired_at timestamptz NOT NULL DEFAULT now(),
    fired_by text        NOT NULL,
    -- Earlier due ticks this firing stood in for (policy 'once') or that
    -- were dropped before it.
    missed   bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (schedule, tick)
);

-- The schedules each runner declares, `{name: definition}`, written with its
-- heartbeat: a schedule no live runner declares as stored is stale.
ALTER TABLE pgfifo.runner ADD COLUMN schedules jsonb NOT NULL DEFAULT '{}';

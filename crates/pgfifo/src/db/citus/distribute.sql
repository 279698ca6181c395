-- The distributed layout (docs/scaling.md, "On Citus"): pgfifo's tables
-- spread over a Citus cluster's workers by part, a fixed hash of a group's
-- queue and name modulo 1024 (pgfifo.part_of). Run once, on the
-- coordinator, by pgfifo::migrate::distribute, in the transaction that then
-- reinstalls the functions in their distributed form; runners stopped
-- (create_distributed_table copies every row and locks each table).
--
-- Three kinds of table:
--  * a group's rows, distributed by part and co-located with
--    pgfifo.queue_group, so that a group's row, its jobs, their attempts,
--    trace contexts, batch membership and dependencies, its pause, wake-up,
--    rate bucket, slots, snooze, share and long run share one shard. An
--    ungrouped job's part is that of its unique key, or its id modulo 1024
--    (pgfifo.job_part). A dedup window's part is that of its queue and key,
--    as if the key were a group.
--  * the batches' own rows (batch, batch_shard, batch_callback),
--    distributed by batch id in a colocation group of their own;
--  * small tables read everywhere and written rarely (queue settings),
--    reference tables: a copy on every node.
-- The runners' registry, the per-minute counts, the schedules and their
-- ticks, the group limits, the queue limits with their slots and buckets,
-- and the schema's bookkeeping stay ordinary tables on the coordinator:
-- only the coordinator's sessions read or write them (a schedule's firing
-- locks its row there, FOR UPDATE SKIP LOCKED, for the transaction that
-- enqueues its jobs; a pick locks a queue's slot there for its job
-- transaction, and a start writes its queue's bucket there: as reference
-- tables, each would be a write to every node). The group limits are read
-- by every pick, start and completion in a queue (whether it has any, and
-- its defaults): a read of a local table, where a reference table's would
-- go through Citus's planner each time.
--
-- Every primary key and unique index of a distributed table must hold the
-- distribution column, so they gain `part`: a unique key is unique within
-- its part (documented), and a group's long run within the group as before.

-- One connection per node for the whole transaction (the reference tables
-- below are written once it has written to distributed tables).
SET LOCAL citus.multi_shard_modify_mode TO 'sequential';

CREATE TABLE pgfifo.schema_layout (
    id          boolean     PRIMARY KEY DEFAULT true CHECK (id),
    layout      text        NOT NULL CHECK (layout = 'distributed'),
    parts       integer     NOT NULL,
    citus       text        NOT NULL,
    laid_out_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO pgfifo.schema_layout (layout, parts, citus)
SELECT 'distributed', 1024, extversion FROM pg_extension WHERE extname = 'citus';

-- The part of every row.
ALTER TABLE pgfifo.queue_group   ADD COLUMN part integer;
ALTER TABLE pgfifo.group_pause   ADD COLUMN part integer;
ALTER TABLE pgfifo.group_wake    ADD COLUMN part integer;
ALTER TABLE pgfifo.group_bucket  ADD COLUMN part integer;
ALTER TABLE pgfifo.group_slot    ADD COLUMN part integer;
ALTER TABLE pgfifo.group_snooze  ADD COLUMN part integer;
ALTER TABLE pgfifo.group_share   ADD COLUMN part integer;
ALTER TABLE pgfifo.job           ADD COLUMN part integer;
ALTER TABLE pgfifo.job_run       ADD COLUMN part integer;
ALTER TABLE pgfifo.job_attempt   ADD COLUMN part integer;
ALTER TABLE pgfifo.job_trace     ADD COLUMN part integer;
ALTER TABLE pgfifo.batch_job     ADD COLUMN part integer;
ALTER TABLE pgfifo.job_dependency ADD COLUMN part integer;
ALTER TABLE pgfifo.job_wait      ADD COLUMN part integer;
ALTER TABLE pgfifo.job_window    ADD COLUMN part integer;

UPDATE pgfifo.queue_group   SET part = pgfifo.part_of(queue, group_id);
UPDATE pgfifo.group_pause   SET part = pgfifo.part_of(queue, group_id);
UPDATE pgfifo.group_wake    SET part = pgfifo.part_of(queue, group_id);
UPDATE pgfifo.group_bucket  SET part = pgfifo.part_of(queue, group_id);
UPDATE pgfifo.group_slot    SET part = pgfifo.part_of(queue, group_id);
UPDATE pgfifo.group_snooze  SET part = pgfifo.part_of(queue, group_id);
UPDATE pgfifo.group_share   SET part = pgfifo.part_of(queue, group_id);
UPDATE pgfifo.job           SET part = pgfifo.job_part(queue, group_id, id, unique_key);
UPDATE pgfifo.job_window    SET part = pgfifo.part_of(queue, key);
-- A window's job is on its own part (its group's): the window keeps it, so
-- that debouncing finds the job on its shard (NULL: the job is gone, and
-- the window holds nothing).
ALTER TABLE pgfifo.job_window ADD COLUMN job_part integer;
-- Rows of jobs: their job's part. A row whose job is gone (none should be)
-- takes the part of its id, as an ungrouped job would.
UPDATE pgfifo.job_attempt AS t SET part = coalesce(
    (SELECT j.part FROM pgfifo.job AS j WHERE j.id = t.job_id), (t.job_id & 1023)::integer);
UPDATE pgfifo.job_run AS t SET part = coalesce(
    (SELECT j.part FROM pgfifo.job AS j WHERE j.id = t.job_id),
    pgfifo.job_part(t.queue, t.group_id, t.job_id));
UPDATE pgfifo.job_trace AS t SET part = coalesce(
    (SELECT j.part FROM pgfifo.job AS j WHERE j.id = t.job_id), (t.job_id & 1023)::integer);
UPDATE pgfifo.batch_job AS t SET part = coalesce(
    (SELECT j.part FROM pgfifo.job AS j WHERE j.id = t.job_id), (t.job_id & 1023)::integer);
UPDATE pgfifo.job_dependency AS t SET part = coalesce(
    (SELECT j.part FROM pgfifo.job AS j WHERE j.id = t.job_id), (t.job_id & 1023)::integer);
UPDATE pgfifo.job_wait AS t SET part = coalesce(
    (SELECT j.part FROM pgfifo.job AS j WHERE j.id = t.job_id), (t.job_id & 1023)::integer);
UPDATE pgfifo.job_window AS t SET job_part = (SELECT j.part FROM pgfifo.job AS j WHERE j.id = t.job_id);

ALTER TABLE pgfifo.queue_group   ALTER COLUMN part SET NOT NULL;
ALTER TABLE pgfifo.group_pause   ALTER COLUMN part SET NOT NULL;
ALTER TABLE pgfifo.group_wake    ALTER COLUMN part SET NOT NULL;
ALTER TABLE pgfifo.group_bucket  ALTER COLUMN part SET NOT NULL;
ALTER TABLE pgfifo.group_slot    ALTER COLUMN part SET NOT NULL;
ALTER TABLE pgfifo.group_snooze  ALTER COLUMN part SET NOT NULL;
ALTER TABLE pgfifo.group_share   ALTER COLUMN part SET NOT NULL;
ALTER TABLE pgfifo.job           ALTER COLUMN part SET NOT NULL;
ALTER TABLE pgfifo.job_run       ALTER COLUMN part SET NOT NULL;
ALTER TABLE pgfifo.job_attempt   ALTER COLUMN part SET NOT NULL;
ALTER TABLE pgfifo.job_trace     ALTER COLUMN part SET NOT NULL;
ALTER TABLE pgfifo.batch_job     ALTER COLUMN part SET NOT NULL;
ALTER TABLE pgfifo.job_dependency ALTER COLUMN part SET NOT NULL;
ALTER TABLE pgfifo.job_wait      ALTER COLUMN part SET NOT NULL;
ALTER TABLE pgfifo.job_window    ALTER COLUMN part SET NOT NULL;

-- Keys with the part first.
ALTER TABLE pgfifo.queue_group DROP CONSTRAINT queue_group_pkey,
    ADD PRIMARY KEY (part, queue, group_id);
ALTER TABLE pgfifo.group_pause DROP CONSTRAINT group_pause_pkey,
    ADD PRIMARY KEY (part, queue, group_id);
ALTER TABLE pgfifo.group_bucket DROP CONSTRAINT group_bucket_pkey,
    ADD PRIMARY KEY (part, queue, group_id);
ALTER TABLE pgfifo.group_slot DROP CONSTRAINT group_slot_pkey,
    ADD PRIMARY KEY (part, queue, group_id, slot);
ALTER TABLE pgfifo.group_snooze DROP CONSTRAINT group_snooze_pkey,
    ADD PRIMARY KEY (part, queue, group_id);
ALTER TABLE pgfifo.group_share DROP CONSTRAINT group_share_pkey,
    ADD PRIMARY KEY (part, queue, group_id);
ALTER TABLE pgfifo.job DROP CONSTRAINT job_pkey, ADD PRIMARY KEY (part, id);
DROP INDEX pgfifo.job_unique_key_idx;
CREATE UNIQUE INDEX job_unique_key_idx ON pgfifo.job (part, queue, unique_key)
    WHERE unique_key IS NOT NULL AND state = 'queued';
ALTER TABLE pgfifo.job_run DROP CONSTRAINT job_run_pkey, ADD PRIMARY KEY (part, job_id);
DROP INDEX pgfifo.job_run_group_idx;
CREATE UNIQUE INDEX job_run_group_idx ON pgfifo.job_run (part, queue, group_id);
ALTER TABLE pgfifo.job_attempt DROP CONSTRAINT job_attempt_pkey,
    ADD PRIMARY KEY (part, job_id, attempt);
ALTER TABLE pgfifo.job_trace DROP CONSTRAINT job_trace_pkey, ADD PRIMARY KEY (part, job_id);
-- A job's batch is on another shard: the foreign key cannot stay (retention
-- deletes a batch's jobs' rows itself in this layout).
ALTER TABLE pgfifo.batch_job DROP CONSTRAINT batch_job_batch_id_fkey,
    DROP CONSTRAINT batch_job_pkey, ADD PRIMARY KEY (part, job_id);
ALTER TABLE pgfifo.job_wait DROP CONSTRAINT job_wait_pkey, ADD PRIMARY KEY (part, job_id);
ALTER TABLE pgfifo.job_window DROP CONSTRAINT job_window_pkey, ADD PRIMARY KEY (part, queue, key);

-- Spread.
SELECT create_distributed_table('pgfifo.queue_group', 'part', shard_count := 32);
SELECT create_distributed_table('pgfifo.' || t, 'part', colocate_with := 'pgfifo.queue_group')
FROM unnest(ARRAY['group_pause', 'group_wake', 'group_bucket', 'group_slot',
                  'group_snooze', 'group_share', 'job', 'job_run', 'job_attempt', 'job_trace',
                  'batch_job', 'job_dependency', 'job_wait', 'job_window']) AS t;
SELECT create_distributed_table('pgfifo.batch', 'id', shard_count := 32, colocate_with := 'none');
SELECT create_distributed_table('pgfifo.' || t, 'batch_id', colocate_with := 'pgfifo.batch')
FROM unnest(ARRAY['batch_shard', 'batch_callback']) AS t;
-- Which parts each shard of the groups' tables holds, for the pick and
-- promote, which visit one shard at a time. A rebalance moves whole
-- shards (their parts with them) and leaves this as it is; splitting a
-- shard would not, and is not supported.
CREATE TABLE pgfifo.layout_shard (
    shard integer   PRIMARY KEY,
    parts integer[] NOT NULL
);
INSERT INTO pgfifo.layout_shard (shard, parts)
SELECT row_number() OVER (ORDER BY min(p)) - 1, array_agg(p ORDER BY p)
FROM generate_series(0, 1023) AS p
GROUP BY get_shard_id_for_distribution_column('pgfifo.queue_group', p);

SELECT create_reference_table('pgfifo.' || t)
FROM unnest(ARRAY['queue_setting', 'layout_shard']) AS t;

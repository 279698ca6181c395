-- The attempt record of one job for `floor.sh`: one row, committed on its
-- own (pgfifo records it outside the job's transaction, durably, before the
-- handler starts).
\set id random(1, 2000000000)
INSERT INTO pgfifo.job_attempt (job_id, attempt, runner)
VALUES (:id, 1, 'floor') ON CONFLICT DO NOTHING;

-- Reverts 0004_schedules: the schedules and their tick history are dropped
-- (the jobs they enqueued stay).
ALTER TABLE pgfifo.runner DROP COLUMN IF EXISTS schedules;
DROP TABLE IF EXISTS pgfifo.schedule_tick;
DROP TABLE IF EXISTS pgfifo.schedule;

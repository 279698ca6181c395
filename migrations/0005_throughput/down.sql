-- Reverts 0005_throughput: the per-minute counts are dropped.
DROP TABLE IF EXISTS pgfifo.queue_minute;

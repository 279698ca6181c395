-- Reverts 0009_trace_context: the jobs' trace contexts are gone; their
-- attempts start traces of their own. The functions stay: the overload of
-- pgfifo.enqueue that takes a trace context stores it only while
-- pgfifo.job_trace exists, and enqueues the jobs either way.
DROP TABLE IF EXISTS pgfifo.job_trace;

-- 0009_trace_context: a job may carry the W3C trace context of its enqueue
-- (https://www.w3.org/TR/trace-context/), so that the spans of its attempts
-- continue the trace of the code that enqueued it (docs/tracing.md).
--
-- Written by the overload of pgfifo.enqueue that takes traceparent and
-- tracestate arrays (pgfifo's `otel` feature calls it when a span is
-- current; producers in other languages may call it too), read by the
-- runner's pick statement beside each picked job. A job without a context
-- has no row: nothing is stored and nothing is read for it.
--
-- A table of its own, not a column of pgfifo.job: adding a column there
-- would wait for every running job (see 0007_long_runs), and this table
-- stays empty where nobody traces. Retention deletes the rows of purged
-- jobs (the same walk, by job id range).
CREATE TABLE pgfifo.job_trace (
    job_id      bigint PRIMARY KEY,
    -- version-traceid-parentid-flags, lower-case hex; a later version may
    -- append fields after a dash, as the specification allows.
    traceparent text   NOT NULL
                CHECK (traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-.*)?$'
                       AND octet_length(traceparent) <= 512),
    -- Vendors' entries, passed on as received.
    tracestate  text   CHECK (octet_length(tracestate) <= 8192)
);

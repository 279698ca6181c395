-- The SQL API for producers in other languages: pgfifo.add_job (one job)
-- and pgfifo.add_jobs (many), documented in docs/enqueue-from-sql.md.
--
-- Installed whole by `migrate` (CREATE OR REPLACE) after the numbered
-- migrations; see crates/pgfifo/src/migrate.rs and docs/upgrading.md for
-- how a change of arguments or result type is made.
--
-- STABLE: the signatures of add_job and add_jobs, their parameter names,
-- their defaults and the meaning of each field are a public interface that
-- applications in other languages call. They follow docs/upgrading.md's
-- rules: a change of arguments is a new overload beside the old one, which
-- stays for at least one release; a new optional parameter goes last, with
-- a default that keeps the old meaning. Bad input raises SQLSTATE 22023
-- (invalid_parameter_value) with the constraint name pgfifo_bad_job and the
-- offending field in the error's COLUMN field; those stay too.
--
-- Both wrap pgfifo.enqueue, the entry point of pgfifo's Rust client, after
-- checking each field by the rules the Rust client applies before it calls
-- enqueue (crates/pgfifo/src/enqueue.rs, names.rs, registry.rs): they run in
-- the caller's transaction, need READ COMMITTED as enqueue does, and write
-- nothing when a field is bad (the error ends the statement before enqueue
-- runs).

-- Checks one job's fields and returns them as pgfifo.enqueue takes them.
-- p_where names the job in messages ('' for add_job, 'jobs[3].' for the
-- fourth element of add_jobs). Internal: called by add_job and add_jobs.
CREATE OR REPLACE FUNCTION pgfifo.add_job_checked(
    p_where        text,
    p_kind         text,
    p_queue        text,
    p_payload      jsonb,
    p_group_id     text,
    p_run_at       timestamptz,
    p_delay        interval,
    p_priority     integer,
    p_unique_key   text,
    p_max_attempts integer,
    OUT priority     smallint,
    OUT max_attempts integer,
    OUT run_at_us    bigint,
    OUT delay_us     bigint
)
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_field   text;
    v_problem text;
    v_us      numeric;
    v_at      timestamptz;
BEGIN
    IF p_kind IS NULL OR octet_length(p_kind) NOT BETWEEN 1 AND 256 THEN
        v_field := 'kind';
        v_problem := 'must be a job kind of 1 to 256 bytes (the `kind` of a job type, '
                     || 'its Rust type name unless #[job(kind = "...")] says otherwise)';
    ELSIF p_queue IS NULL OR octet_length(p_queue) NOT BETWEEN 1 AND 128 THEN
        v_field := 'queue';
        v_problem := 'must be a queue name of 1 to 128 bytes';
    ELSIF p_payload IS NULL THEN
        v_field := 'payload';
        v_problem := 'must be a JSON value (SQL NULL given; the JSON null is ''null''::jsonb)';
    ELSIF p_group_id IS NOT NULL AND octet_length(p_group_id) NOT BETWEEN 1 AND 256 THEN
        v_field := 'group_id';
        v_problem := 'must be NULL (an ungrouped job) or a group name of 1 to 256 bytes';
    ELSIF p_run_at IS NOT NULL AND p_delay IS NOT NULL THEN
        v_field := 'run_at';
        v_problem := 'and delay are both given: give one of them, or neither (run now)';
    ELSIF p_run_at IS NOT NULL AND NOT isfinite(p_run_at) THEN
        v_field := 'run_at';
        v_problem := 'must be a finite time';
    ELSIF p_delay IS NOT NULL AND NOT isfinite(p_delay) THEN
        v_field := 'delay';
        v_problem := 'must be a finite interval';
    ELSIF p_delay IS NOT NULL AND p_delay < interval '0' THEN
        v_field := 'delay';
        v_problem := 'must not be negative';
    ELSIF p_priority IS NOT NULL AND p_priority NOT BETWEEN -32768 AND 32767 THEN
        v_field := 'priority';
        v_problem := 'must be between -32768 and 32767';
    ELSIF p_unique_key IS NOT NULL AND octet_length(p_unique_key) NOT BETWEEN 1 AND 256 THEN
        v_field := 'unique_key';
        v_problem := 'must be NULL (none) or a key of 1 to 256 bytes';
    ELSIF p_max_attempts IS NOT NULL AND p_max_attempts < 1 THEN
        v_field := 'max_attempts';
        v_problem := 'must be at least 1';
    END IF;
    IF v_field IS NULL AND p_delay IS NOT NULL THEN
        v_us := extract(epoch FROM p_delay) * 1000000;
        BEGIN
            v_at := now() + p_delay;
        EXCEPTION WHEN datetime_field_overflow THEN
            v_at := NULL;
        END;
        IF v_at IS NULL OR v_us > 9223372036854775807 THEN
            v_field := 'delay';
            v_problem := 'is too long';
        END IF;
    END IF;
    IF v_field IS NOT NULL THEN
        RAISE EXCEPTION 'pgfifo: % %', p_where || v_field, v_problem
            USING ERRCODE = 'invalid_parameter_value', CONSTRAINT = 'pgfifo_bad_job',
                  COLUMN = v_field;
    END IF;
    priority := coalesce(p_priority, 0);
    max_attempts := coalesce(p_max_attempts, 5);
    run_at_us := (extract(epoch FROM p_run_at) * 1000000)::bigint;
    delay_us := round(v_us)::bigint;
END
$$;

-- Whether a job's W3C trace context (docs/tracing.md) is to be stored:
-- its traceparent is given and the schema keeps contexts (pgfifo.job_trace,
-- migration 9; after `migrate down` past it the context is dropped, as
-- pgfifo.enqueue's traced overload does). A tracestate without a
-- traceparent is an error; the format of a traceparent is checked where it
-- is stored (constraint job_trace_traceparent_check). Internal: called by
-- add_job and add_jobs.
CREATE OR REPLACE FUNCTION pgfifo.add_job_traced(p_where text, p_traceparent text, p_tracestate text)
RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF p_traceparent IS NULL AND p_tracestate IS NOT NULL THEN
        RAISE EXCEPTION 'pgfifo: %tracestate is given without a traceparent', p_where
            USING ERRCODE = 'invalid_parameter_value', CONSTRAINT = 'pgfifo_bad_job',
                  COLUMN = 'tracestate';
    END IF;
    RETURN p_traceparent IS NOT NULL AND to_regclass('pgfifo.job_trace') IS NOT NULL;
END
$$;

-- Checks a job's de-duplication window (docs/dedup-windows.md) and returns
-- its period in microseconds (NULL: no window). Internal: called by add_job
-- and add_jobs. Errors as add_job_checked's.
CREATE OR REPLACE FUNCTION pgfifo.add_job_window_checked(
    p_where      text,
    p_key        text,
    p_mode       text,
    p_period     interval,
    p_unique_key text,
    p_run_at     timestamptz,
    p_delay      interval
) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_field   text;
    v_problem text;
    v_us      numeric;
BEGIN
    IF p_key IS NULL AND p_mode IS NULL AND p_period IS NULL THEN
        RETURN NULL;
    END IF;
    IF p_mode IS NULL OR p_mode NOT IN ('unique', 'debounce', 'throttle') THEN
        v_field := 'window_mode';
        v_problem := 'must be unique, debounce or throttle when window_key or window_period is given';
    ELSIF p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND 256 THEN
        v_field := 'window_key';
        v_problem := 'must be a key of 1 to 256 bytes for a ' || p_mode || ' window';
    ELSIF p_period IS NULL OR NOT isfinite(p_period) OR p_period <= interval '0' THEN
        v_field := 'window_period';
        v_problem := 'must be a positive interval for a ' || p_mode || ' window';
    ELSIF p_unique_key IS NOT NULL THEN
        v_field := 'unique_key';
        v_problem := 'and a ' || p_mode || ' window are both given: give one of them';
    ELSIF p_mode = 'debounce' AND (p_run_at IS NOT NULL OR p_delay IS NOT NULL) THEN
        v_field := 'run_at';
        v_problem := 'and delay do not apply to a debounced job (it starts at now + window_period)';
    END IF;
    IF v_field IS NULL THEN
        v_us := round(extract(epoch FROM p_period) * 1000000);
        IF v_us < 1 OR v_us > 9223372036854775807 THEN
            v_field := 'window_period';
            v_problem := 'must be between 1 microsecond and about 292000 years';
        END IF;
    END IF;
    IF v_field IS NOT NULL THEN
        RAISE EXCEPTION 'pgfifo: % %', p_where || v_field, v_problem
            USING ERRCODE = 'invalid_parameter_value', CONSTRAINT = 'pgfifo_bad_job',
                  COLUMN = v_field;
    END IF;
    RETURN v_us::bigint;
END
$$;

-- Enqueues jobs with de-duplication windows (pgfifo.enqueue_outcomes) and
-- stores the trace contexts given (p_traceparent NULL: none) of the jobs
-- it created; a job it folded a row into keeps its own. Returns the ids
-- and the outcome of each ('created', 'deduplicated', 'debounced',
-- 'throttled'). Internal: called by add_job_windowed and add_job_outcome.
CREATE OR REPLACE FUNCTION pgfifo.add_job_enqueued(
    p_queue text[], p_group text[], p_kind text[], p_payload jsonb[], p_priority smallint[],
    p_max_attempts integer[], p_unique_key text[], p_run_at_us bigint[], p_delay_us bigint[],
    p_window_key text[], p_window_mode text[], p_window_us bigint[],
    p_traceparent text[], p_tracestate text[],
    OUT ids bigint[], OUT outcomes text[]
)
LANGUAGE plpgsql
AS $$
BEGIN
    SELECT o.ids, o.outcomes INTO ids, outcomes
    FROM pgfifo.enqueue_outcomes(p_queue, p_group, p_kind, p_payload, p_priority, p_max_attempts,
                                 p_unique_key, p_run_at_us, p_delay_us,
                                 p_window_key, p_window_mode, p_window_us) AS o;
    IF p_traceparent IS NOT NULL AND to_regclass('pgfifo.job_trace') IS NOT NULL THEN
        INSERT INTO pgfifo.job_trace (job_id, traceparent, tracestate)
        SELECT t.id, t.tp, nullif(t.ts, '')
        FROM unnest(ids, outcomes, p_traceparent, p_tracestate) AS t(id, outcome, tp, ts)
        WHERE t.outcome = 'created' AND t.tp IS NOT NULL
        ON CONFLICT (job_id) DO NOTHING;
    END IF;
END
$$;

-- The ids of pgfifo.add_job_enqueued. Internal: called by add_job and
-- add_jobs.
CREATE OR REPLACE FUNCTION pgfifo.add_job_windowed(
    p_queue text[], p_group text[], p_kind text[], p_payload jsonb[], p_priority smallint[],
    p_max_attempts integer[], p_unique_key text[], p_run_at_us bigint[], p_delay_us bigint[],
    p_window_key text[], p_window_mode text[], p_window_us bigint[],
    p_traceparent text[], p_tracestate text[]
) RETURNS bigint[]
LANGUAGE sql
AS $$
    SELECT e.ids
    FROM pgfifo.add_job_enqueued(p_queue, p_group, p_kind, p_payload, p_priority, p_max_attempts,
                                 p_unique_key, p_run_at_us, p_delay_us, p_window_key,
                                 p_window_mode, p_window_us, p_traceparent, p_tracestate) AS e
$$;

-- Enqueues one job and returns its id (for a unique key that an unfinished
-- job of the queue holds, that job's id, and nothing is written). Call it
-- with named parameters:
--
--   SELECT pgfifo.add_job(kind => 'SendEmail', queue => 'mail',
--                         payload => '{"to": "a@example.com"}',
--                         group_id => 'tenant-42');
--
-- kind, queue and payload are required; the rest default to: no group (an
-- ungrouped job), run now, priority 0, no unique key, 5 attempts (the
-- defaults of #[derive(Job)]; a type's own attributes are not known here:
-- `pgfifo job-types --json` prints them). NULL in an optional parameter
-- means its default. window_key, window_mode ('unique', 'debounce',
-- 'throttle') and window_period give the job a de-duplication window
-- (docs/dedup-windows.md): the id returned is then the job the window
-- folded this one into, if it did.
CREATE OR REPLACE FUNCTION pgfifo.add_job(
    kind         text,
    queue        text,
    payload      jsonb,
    group_id     text        DEFAULT NULL,
    run_at       timestamptz DEFAULT NULL,
    delay        interval    DEFAULT NULL,
    priority     integer     DEFAULT NULL,
    unique_key   text        DEFAULT NULL,
    max_attempts integer     DEFAULT NULL,
    traceparent  text        DEFAULT NULL,
    tracestate   text        DEFAULT NULL,
    window_key   text        DEFAULT NULL,
    window_mode  text        DEFAULT NULL,
    window_period interval   DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v        record;
    v_us     bigint;
    v_traced boolean;
    v_ids    bigint[];
BEGIN
    SELECT * INTO v
    FROM pgfifo.add_job_checked('', add_job.kind, add_job.queue, add_job.payload,
                                add_job.group_id, add_job.run_at, add_job.delay,
                                add_job.priority, add_job.unique_key, add_job.max_attempts);
    v_us := pgfifo.add_job_window_checked('', add_job.window_key, add_job.window_mode,
                                          add_job.window_period, add_job.unique_key,
                                          add_job.run_at, add_job.delay);
    v_traced := pgfifo.add_job_traced('', add_job.traceparent, add_job.tracestate);
    IF v_us IS NOT NULL THEN
        v_ids := pgfifo.add_job_windowed(
            ARRAY[add_job.queue], ARRAY[add_job.group_id], ARRAY[add_job.kind],
            ARRAY[add_job.payload], ARRAY[v.priority], ARRAY[v.max_attempts],
            ARRAY[NULL::text], ARRAY[v.run_at_us], ARRAY[v.delay_us],
            ARRAY[add_job.window_key], ARRAY[add_job.window_mode], ARRAY[v_us],
            CASE WHEN v_traced THEN ARRAY[add_job.traceparent] END, ARRAY[add_job.tracestate]);
        RETURN v_ids[1];
    END IF;
    IF v_traced THEN
        RETURN (pgfifo.enqueue(ARRAY[add_job.queue], ARRAY[add_job.group_id], ARRAY[add_job.kind],
                               ARRAY[add_job.payload], ARRAY[v.priority], ARRAY[v.max_attempts],
                               ARRAY[add_job.unique_key], ARRAY[v.run_at_us], ARRAY[v.delay_us],
                               ARRAY[add_job.traceparent], ARRAY[add_job.tracestate]))[1];
    END IF;
    RETURN (pgfifo.enqueue(ARRAY[add_job.queue], ARRAY[add_job.group_id], ARRAY[add_job.kind],
                           ARRAY[add_job.payload], ARRAY[v.priority], ARRAY[v.max_attempts],
                           ARRAY[add_job.unique_key], ARRAY[v.run_at_us],
                           ARRAY[v.delay_us]))[1];
END
$$;

-- add_job that also says what became of the call: one row (id, outcome),
-- outcome 'created' (a new job), 'deduplicated' (a unique key held by a
-- queued job, or a unique window: id is that job's), 'debounced' (id is the
-- waiting job that took this payload and start) or 'throttled' (id is the
-- job of the key's current period; nothing was written). The same
-- parameters, defaults and errors as add_job:
--
--   SELECT id, outcome FROM pgfifo.add_job_outcome(kind => 'Sync', queue => 'sync',
--       payload => '{}', group_id => 'tenant-42', window_key => 'sync:42',
--       window_mode => 'throttle', window_period => '1 minute');
CREATE OR REPLACE FUNCTION pgfifo.add_job_outcome(
    kind          text,
    queue         text,
    payload       jsonb,
    group_id      text        DEFAULT NULL,
    run_at        timestamptz DEFAULT NULL,
    delay         interval    DEFAULT NULL,
    priority      integer     DEFAULT NULL,
    unique_key    text        DEFAULT NULL,
    max_attempts  integer     DEFAULT NULL,
    traceparent   text        DEFAULT NULL,
    tracestate    text        DEFAULT NULL,
    window_key    text        DEFAULT NULL,
    window_mode   text        DEFAULT NULL,
    window_period interval    DEFAULT NULL,
    OUT id        bigint,
    OUT outcome   text
)
LANGUAGE plpgsql
AS $$
DECLARE
    v        record;
    v_us     bigint;
    v_traced boolean;
    e        record;
BEGIN
    SELECT * INTO v
    FROM pgfifo.add_job_checked('', add_job_outcome.kind, add_job_outcome.queue,
                                add_job_outcome.payload, add_job_outcome.group_id,
                                add_job_outcome.run_at, add_job_outcome.delay,
                                add_job_outcome.priority, add_job_outcome.unique_key,
                                add_job_outcome.max_attempts);
    v_us := pgfifo.add_job_window_checked('', add_job_outcome.window_key,
                                          add_job_outcome.window_mode,
                                          add_job_outcome.window_period,
                                          add_job_outcome.unique_key, add_job_outcome.run_at,
                                          add_job_outcome.delay);
    v_traced := pgfifo.add_job_traced('', add_job_outcome.traceparent, add_job_outcome.tracestate);
    SELECT * INTO e
    FROM pgfifo.add_job_enqueued(
        ARRAY[add_job_outcome.queue], ARRAY[add_job_outcome.group_id],
        ARRAY[add_job_outcome.kind], ARRAY[add_job_outcome.payload], ARRAY[v.priority],
        ARRAY[v.max_attempts], ARRAY[add_job_outcome.unique_key], ARRAY[v.run_at_us],
        ARRAY[v.delay_us], ARRAY[CASE WHEN v_us IS NOT NULL THEN add_job_outcome.window_key END],
        ARRAY[CASE WHEN v_us IS NOT NULL THEN add_job_outcome.window_mode END], ARRAY[v_us],
        CASE WHEN v_traced THEN ARRAY[add_job_outcome.traceparent] END,
        ARRAY[add_job_outcome.tracestate]);
    id := e.ids[1];
    outcome := e.outcomes[1];
END
$$;

-- The interval in field p_field of one job of add_jobs: a JSON string
-- PostgreSQL reads as an interval, or a number of seconds; NULL when absent
-- or JSON null. Anything else is an error naming the field, with p_example
-- as a value that would do. Internal: called by add_jobs.
CREATE OR REPLACE FUNCTION pgfifo.add_job_interval(
    p_where text, p_job jsonb, p_field text, p_example text
) RETURNS interval
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF coalesce(jsonb_typeof(p_job -> p_field), 'null') NOT IN ('number', 'string', 'null') THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN CASE jsonb_typeof(p_job -> p_field)
        WHEN 'number' THEN (p_job ->> p_field)::double precision * interval '1 second'
        WHEN 'string' THEN (p_job ->> p_field)::interval
        END;
EXCEPTION WHEN data_exception THEN
    RAISE EXCEPTION 'pgfifo: % must be an interval such as "%" or a number of seconds (got %)',
        p_where || p_field, p_example, p_job -> p_field
        USING ERRCODE = 'invalid_parameter_value', CONSTRAINT = 'pgfifo_bad_job',
              COLUMN = p_field;
END
$$;

-- Enqueues many jobs in one call and returns their ids in input order (see
-- add_job for a unique key that is taken). jobs is a JSON array of objects
-- with the fields of add_job:
--
--   SELECT pgfifo.add_jobs(jobs => '[
--     {"kind": "SendEmail", "queue": "mail", "payload": {"to": "a@example.com"},
--      "group_id": "tenant-42"},
--     {"kind": "SendEmail", "queue": "mail", "payload": {"to": "b@example.com"},
--      "group_id": "tenant-42", "delay": "5 minutes", "priority": 3}
--   ]');
--
-- run_at is a time as PostgreSQL reads timestamptz ("2030-01-02T03:04:05Z");
-- delay an interval ("90 seconds", "PT90S") or a number of seconds. Jobs of
-- one group are ordered as given; window_period, like delay, is an interval
-- or a number of seconds. A field that is not one of add_job's is an
-- error (a misspelt field would otherwise be dropped silently), and so is
-- any bad field of any job: then no job is written.
CREATE OR REPLACE FUNCTION pgfifo.add_jobs(jobs jsonb) RETURNS bigint[]
LANGUAGE plpgsql
AS $$
DECLARE
    v_fields constant text[] := ARRAY['kind', 'queue', 'payload', 'group_id', 'run_at', 'delay',
                                      'priority', 'unique_key', 'max_attempts', 'traceparent',
                                      'tracestate', 'window_key', 'window_mode', 'window_period'];
    v_n      integer;
    v_i      integer;
    v_job    jsonb;
    v_where  text;
    v_key    text;
    v_text   text[];
    v_at     timestamptz;
    v_delay  interval;
    v_int    integer[];
    v        record;
    a_queue  text[] := '{}';
    a_group  text[] := '{}';
    a_kind   text[] := '{}';
    a_pay    jsonb[] := '{}';
    a_prio   smallint[] := '{}';
    a_max    integer[] := '{}';
    a_key    text[] := '{}';
    a_at     bigint[] := '{}';
    a_delay  bigint[] := '{}';
    a_wkey   text[] := '{}';
    a_wmode  text[] := '{}';
    a_wus    bigint[] := '{}';
    v_period interval;
    v_us     bigint;
    a_tp     text[] := '{}';
    a_ts     text[] := '{}';
    v_traced boolean := false;
BEGIN
    IF jobs IS NULL OR jsonb_typeof(jobs) <> 'array' THEN
        RAISE EXCEPTION 'pgfifo: jobs must be a JSON array of objects (got %)',
            coalesce(jsonb_typeof(jobs), 'SQL NULL')
            USING ERRCODE = 'invalid_parameter_value', CONSTRAINT = 'pgfifo_bad_job',
                  COLUMN = 'jobs';
    END IF;
    v_n := jsonb_array_length(jobs);
    FOR v_i IN 0 .. v_n - 1 LOOP
        v_job := jobs -> v_i;
        v_where := format('jobs[%s].', v_i);
        IF jsonb_typeof(v_job) <> 'object' THEN
            RAISE EXCEPTION 'pgfifo: jobs[%] must be a JSON object (got %)', v_i, jsonb_typeof(v_job)
                USING ERRCODE = 'invalid_parameter_value', CONSTRAINT = 'pgfifo_bad_job',
                      COLUMN = 'jobs';
        END IF;
        SELECT k INTO v_key FROM jsonb_object_keys(v_job) AS k WHERE k <> ALL (v_fields) LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'pgfifo: % is not a field of a job (the fields: %)',
                v_where || v_key, array_to_string(v_fields, ', ')
                USING ERRCODE = 'invalid_parameter_value', CONSTRAINT = 'pgfifo_bad_job',
                      COLUMN = v_key;
        END IF;
        -- Text and number fields: JSON null is absent; another JSON type is an error.
        v_text := '{}';
        FOREACH v_key IN ARRAY ARRAY['kind', 'queue', 'group_id', 'unique_key', 'run_at',
                                     'window_key', 'window_mode', 'traceparent', 'tracestate'] LOOP
            IF jsonb_typeof(v_job -> v_key) NOT IN ('string', 'null') THEN
                RAISE EXCEPTION 'pgfifo: % must be a JSON string (got %)',
                    v_where || v_key, jsonb_typeof(v_job -> v_key)
                    USING ERRCODE = 'invalid_parameter_value', CONSTRAINT = 'pgfifo_bad_job',
                          COLUMN = v_key;
            END IF;
            v_text := v_text || (v_job ->> v_key);
        END LOOP;
        v_int := '{}';
        FOREACH v_key IN ARRAY ARRAY['priority', 'max_attempts'] LOOP
            IF jsonb_typeof(v_job -> v_key) NOT IN ('number', 'null')
               OR (jsonb_typeof(v_job -> v_key) = 'number'
                   AND ((v_job ->> v_key)::numeric <> trunc((v_job ->> v_key)::numeric)
                        OR abs((v_job ->> v_key)::numeric) > 2147483647)) THEN
                RAISE EXCEPTION 'pgfifo: % must be a whole number (got %)',
                    v_where || v_key, v_job -> v_key
                    USING ERRCODE = 'invalid_parameter_value', CONSTRAINT = 'pgfifo_bad_job',
                          COLUMN = v_key;
            END IF;
            v_int := v_int || (v_job ->> v_key)::numeric::integer;
        END LOOP;
        BEGIN
            v_at := (v_text[5])::timestamptz;
        EXCEPTION WHEN data_exception THEN
            RAISE EXCEPTION 'pgfifo: %run_at must be a time such as "2030-01-02T03:04:05Z" (got %)',
                v_where, to_jsonb(v_text[5])
                USING ERRCODE = 'invalid_parameter_value', CONSTRAINT = 'pgfifo_bad_job',
                      COLUMN = 'run_at';
        END;
        v_delay := pgfifo.add_job_interval(v_where, v_job, 'delay', '90 seconds');
        v_period := pgfifo.add_job_interval(v_where, v_job, 'window_period', '10 minutes');
        IF NOT (v_job ? 'payload') THEN
            RAISE EXCEPTION 'pgfifo: %payload is missing (a job without data has the payload null or {})',
                v_where
                USING ERRCODE = 'invalid_parameter_value', CONSTRAINT = 'pgfifo_bad_job',
                      COLUMN = 'payload';
        END IF;
        SELECT * INTO v
        FROM pgfifo.add_job_checked(v_where, v_text[1], v_text[2], v_job -> 'payload', v_text[3],
                                    v_at, v_delay, v_int[1], v_text[4], v_int[2]);
        v_us := pgfifo.add_job_window_checked(v_where, v_text[6], v_text[7], v_period, v_text[4],
                                              v_at, v_delay);
        a_wkey  := a_wkey || v_text[6];
        a_wmode := a_wmode || v_text[7];
        a_wus   := a_wus || v_us;
        a_kind  := a_kind || v_text[1];
        a_queue := a_queue || v_text[2];
        a_pay   := a_pay || (v_job -> 'payload');
        a_group := a_group || v_text[3];
        a_key   := a_key || v_text[4];
        a_prio  := a_prio || v.priority;
        a_max   := a_max || v.max_attempts;
        a_at    := a_at || v.run_at_us;
        a_delay := a_delay || v.delay_us;
        v_traced := pgfifo.add_job_traced(v_where, v_text[8], v_text[9]) OR v_traced;
        a_tp    := a_tp || v_text[8];
        a_ts    := a_ts || v_text[9];
    END LOOP;
    IF v_n = 0 THEN
        RETURN '{}';
    END IF;
    IF cardinality(array_remove(a_wus, NULL)) > 0 THEN
        -- With windows: the id of each row's job, new or folded into.
        RETURN pgfifo.add_job_windowed(a_queue, a_group, a_kind, a_pay, a_prio, a_max, a_key, a_at,
                                       a_delay, a_wkey, a_wmode, a_wus,
                                       CASE WHEN v_traced THEN a_tp END, a_ts);
    END IF;
    IF v_traced THEN
        RETURN pgfifo.enqueue(a_queue, a_group, a_kind, a_pay, a_prio, a_max, a_key, a_at, a_delay,
                              a_tp, a_ts);
    END IF;
    RETURN pgfifo.enqueue(a_queue, a_group, a_kind, a_pay, a_prio, a_max, a_key, a_at, a_delay);
END
$$;

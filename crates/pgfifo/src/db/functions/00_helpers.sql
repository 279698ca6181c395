-- Small helpers the other functions call: the fixed hash, the part and the
-- advisory lock key of a group, a new job's start time, microseconds until a time,
-- and the isolation check of the operator functions.
--
-- Installed whole by `migrate` (CREATE OR REPLACE) after the numbered
-- migrations; see crates/pgfifo/src/migrate.rs and docs/upgrading.md for
-- how a change of arguments or result type is made.

-- The fixed hash of a group: its slot in the pick's round-robin order.
CREATE OR REPLACE FUNCTION pgfifo.group_hash(p_queue text, p_group text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN hashtext(p_queue || chr(31) || p_group);

-- The part of a group: its fixed hash modulo 1024. In the distributed
-- layout (Citus, docs/scaling.md) a group's rows are spread by it, so a
-- group never moves between parts; in a plain database nothing reads it.
CREATE OR REPLACE FUNCTION pgfifo.part_of(p_queue text, p_group text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN hashtext(p_queue || chr(31) || p_group) & 1023;

-- The part of a job: its group's; for an ungrouped job with a unique key,
-- that of the key (as if it were a group, apart from groups by a leading
-- chr(30)), so that an enqueue finds the job that holds the key; for any
-- other ungrouped job its id modulo 1024 (they spread over every part).
CREATE OR REPLACE FUNCTION pgfifo.job_part(p_queue text, p_group text, p_id bigint,
                                           p_key text DEFAULT NULL) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN p_group IS NOT NULL THEN hashtext(p_queue || chr(31) || p_group) & 1023
            WHEN p_key IS NOT NULL THEN hashtext(p_queue || chr(31) || chr(30) || p_key) & 1023
            ELSE (p_id & 1023)::integer END;

-- The advisory lock key of a group (see enqueue and advance_head), in
-- pgfifo's own two-key space (class 0x70676666, "pgff") so it never meets the
-- application's advisory locks. Groups share 1024 stripes per queue, so a
-- batch into any number of groups holds at most 1024 locks (PostgreSQL's lock
-- table is shared and small). Two groups in one stripe only make advance_head
-- put off declaring one of them idle for a moment.
CREATE OR REPLACE FUNCTION pgfifo.group_lock_key(p_queue text, p_group text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (hashtext(p_queue) & ~1023) | (hashtext(p_queue || chr(31) || p_group) & 1023);

-- When a new job may run: an absolute time (µs since the epoch), a delay from
-- the server's clock (µs), or now.
CREATE OR REPLACE FUNCTION pgfifo.run_after(p_run_at_us bigint, p_delay_us bigint) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE
    WHEN p_run_at_us IS NOT NULL THEN to_timestamp(p_run_at_us / 1000000.0)
    WHEN p_delay_us IS NOT NULL THEN now() + p_delay_us * interval '1 microsecond'
    ELSE now()
END;

-- Microseconds from p_now until p_at (0 when p_at has passed).
CREATE OR REPLACE FUNCTION pgfifo.micros_until(p_at timestamptz, p_now timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN greatest(0, extract(epoch FROM p_at - p_now) * 1000000)::bigint;

-- Refuses to run p_what outside READ COMMITTED. The operator functions that
-- change a group's head look for the group's jobs again after taking its
-- locks, as advance_head does: each statement needs a fresh snapshot, which
-- READ COMMITTED gives and REPEATABLE READ does not.
--
-- pgfifo's own errors carry a standard SQLSTATE and a constraint name that
-- says which of pgfifo's rules was broken (diesel's error type keeps the
-- constraint name, not the SQLSTATE): here pgfifo_read_committed, with the
-- isolation level found as the detail.
CREATE OR REPLACE FUNCTION pgfifo.require_read_committed(p_what text) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pgfifo %: needs READ COMMITTED isolation (found %)',
            p_what, current_setting('transaction_isolation')
            USING ERRCODE = 'invalid_transaction_state', CONSTRAINT = 'pgfifo_read_committed',
                  DETAIL = current_setting('transaction_isolation');
    END IF;
END
$$;

-- Refuses what the distributed layout (Citus, docs/scaling.md) does not
-- run yet, naming it: called first by those functions there.
CREATE OR REPLACE FUNCTION pgfifo.not_distributed(p_what text) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION 'pgfifo: % not available on the distributed layout (Citus) yet', p_what
        USING ERRCODE = 'feature_not_supported', CONSTRAINT = 'pgfifo_not_distributed',
              HINT = 'docs/scaling.md lists what runs there';
END
$$;

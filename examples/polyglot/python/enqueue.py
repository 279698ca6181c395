"""Enqueue pgfifo jobs from Python (psycopg 3) through pgfifo's SQL API.

A Rust runner elsewhere runs them (examples/polyglot/runner.rs); this
program runs no runner. See docs/enqueue-from-sql.md.

    pip install "psycopg[binary]"
    DATABASE_URL=postgres://... python3 examples/polyglot/python/enqueue.py

Enqueues 20 jobs of kind "polyglot.step" into queue "polyglot": for each of
two tenants, 10 steps in order (seq 0..9), some one at a time with
pgfifo.add_job and the rest in one pgfifo.add_jobs call, all in one
transaction. Then shows what a
bad field gives: SQLSTATE 22023, the field in the error's column name, and
nothing written.
"""

import json
import os
import sys

import psycopg
from psycopg.types.json import Jsonb

URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
KIND, QUEUE = "polyglot.step", "polyglot"
TENANTS = ["py-acme", "py-globex"]
STEPS = 10


def step(tenant, seq):
    """The payload, as the Rust type `Step` deserializes it."""
    return {"producer": "python", "tenant": tenant, "seq": seq}


def main():
    ids = []
    with psycopg.connect(URL) as conn:
        # One transaction (psycopg opens it; the `with` block commits):
        # the jobs exist if, and only if, it commits.
        with conn.transaction():
            for seq in range(STEPS // 2):
                for tenant in TENANTS:
                    (job_id,) = conn.execute(
                        "SELECT pgfifo.add_job(kind => %s, queue => %s, payload => %s,"
                        " group_id => %s, priority => %s, max_attempts => %s)",
                        (KIND, QUEUE, Jsonb(step(tenant, seq)), tenant, 1, 3),
                    ).fetchone()
                    ids.append(job_id)
            batch = [
                {"kind": KIND, "queue": QUEUE, "group_id": tenant, "payload": step(tenant, seq)}
                for seq in range(STEPS // 2, STEPS)
                for tenant in TENANTS
            ]
            (batch_ids,) = conn.execute(
                "SELECT pgfifo.add_jobs(jobs => %s)", (Jsonb(batch),)
            ).fetchone()
            ids.extend(batch_ids)

        # A bad field: a clear error naming it, and nothing written.
        before = conn.execute("SELECT count(*) FROM pgfifo.job").fetchone()[0]
        try:
            with conn.transaction():
                conn.execute(
                    "SELECT pgfifo.add_job(kind => %s, queue => %s, payload => %s, priority => %s)",
                    (KIND, QUEUE, Jsonb(step("py-acme", 99)), 100000),
                )
            sys.exit("python: a priority of 100000 was accepted")
        except psycopg.errors.InvalidParameterValue as err:
            assert err.sqlstate == "22023", err.sqlstate
            assert err.diag.column_name == "priority", err.diag.column_name
            assert err.diag.constraint_name == "pgfifo_bad_job", err.diag.constraint_name
            print(f"python: bad input refused: {err.diag.message_primary}")
        after = conn.execute("SELECT count(*) FROM pgfifo.job").fetchone()[0]
        assert after == before, (before, after)

    print(f"python: enqueued {len(ids)} jobs: {json.dumps(ids)}")


if __name__ == "__main__":
    main()

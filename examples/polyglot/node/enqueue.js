// Enqueue pgfifo jobs from Node.js (`pg`) through pgfifo's SQL API.
//
// A Rust runner elsewhere runs them (examples/polyglot/runner.rs); this
// program runs no runner. See docs/enqueue-from-sql.md.
//
//     cd examples/polyglot/node && npm ci
//     DATABASE_URL=postgres://... node examples/polyglot/node/enqueue.js
//
// Enqueues 20 jobs of kind "polyglot.step" into queue "polyglot": for each
// of two tenants, 10 steps in order (seq 0..9), some one at a time with
// pgfifo.add_job and the rest in one pgfifo.add_jobs call, in one
// transaction. Then shows what a bad field gives: SQLSTATE 22023, the field
// in the error's column, and nothing written.
'use strict';

const { Client } = require('pg');

const URL = process.env.DATABASE_URL || 'postgres://postgres@127.0.0.1:5432/postgres';
const KIND = 'polyglot.step';
const QUEUE = 'polyglot';
const TENANTS = ['js-initech', 'js-umbrella'];
const STEPS = 10;

// The payload, as the Rust type `Step` deserializes it.
const step = (tenant, seq) => ({ producer: 'node', tenant, seq });

async function main() {
  const client = new Client({ connectionString: URL });
  await client.connect();
  const ids = [];
  try {
    // One transaction: the jobs exist if, and only if, it commits.
    await client.query('BEGIN');
    try {
      for (let seq = 0; seq < STEPS / 2; seq++) {
        for (const tenant of TENANTS) {
          const { rows } = await client.query(
            'SELECT pgfifo.add_job(kind => $1, queue => $2, payload => $3, group_id => $4,' +
              " delay => $5::interval) AS id",
            // pg sends objects as JSON text; bigint ids come back as strings.
            [KIND, QUEUE, step(tenant, seq), tenant, seq === 0 ? '10 milliseconds' : null],
          );
          ids.push(rows[0].id);
        }
      }
      const batch = [];
      for (let seq = STEPS / 2; seq < STEPS; seq++) {
        for (const tenant of TENANTS) {
          batch.push({ kind: KIND, queue: QUEUE, group_id: tenant, payload: step(tenant, seq) });
        }
      }
      // An array parameter would be sent as a PostgreSQL array: stringify it.
      const { rows } = await client.query('SELECT pgfifo.add_jobs(jobs => $1::jsonb) AS ids', [
        JSON.stringify(batch),
      ]);
      ids.push(...rows[0].ids);
      await client.query('COMMIT');
    } catch (err) {
      await client.query('ROLLBACK');
      throw err;
    }

    // A bad field: a clear error naming it, and nothing written.
    const count = async () => (await client.query('SELECT count(*) AS n FROM pgfifo.job')).rows[0].n;
    const before = await count();
    try {
      await client.query('SELECT pgfifo.add_job(kind => $1, queue => $2, payload => $3)', [
        KIND,
        '',
        step('js-initech', 99),
      ]);
      throw new Error('node: an empty queue name was accepted');
    } catch (err) {
      if (err.code !== '22023' || err.column !== 'queue' || err.constraint !== 'pgfifo_bad_job') {
        throw err;
      }
      console.log(`node: bad input refused: ${err.message}`);
    }
    const after = await count();
    if (after !== before) throw new Error(`node: bad input wrote jobs (${before} -> ${after})`);
  } finally {
    await client.end();
  }
  console.log(`node: enqueued ${ids.length} jobs: ${JSON.stringify(ids)}`);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});

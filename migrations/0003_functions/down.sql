-- Reverts 0003_functions. The functions stay as installed: they accept the
-- calls of pgfifo 0.1.0, so that release runs on them.
ALTER TABLE pgfifo.runner DROP COLUMN IF EXISTS release;
DROP TABLE IF EXISTS pgfifo.schema_functions;

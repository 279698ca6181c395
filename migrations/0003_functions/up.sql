-- pgfifo schema, version 3 (pgfifo 0.2.0): functions installed from source.
--
-- The PL/pgSQL functions that 0001 and 0002 created now live in one source
-- file per family (crates/pgfifo/src/db/functions/). `migrate` installs them
-- whole with CREATE OR REPLACE after the numbered migrations, and records
-- here which set it installed; a runner refuses to start unless the set is
-- its own. The bodies installed with this version keep every call of pgfifo
-- 0.1.0 working, so runners of 0.1.0 go on while a rolling deploy replaces
-- them (docs/upgrading.md).
--
-- Nothing here touches the job tables: the upgrade takes no lock that a
-- running job holds.

-- The function set installed, one row.
CREATE TABLE pgfifo.schema_functions (
    id           boolean     PRIMARY KEY DEFAULT true CHECK (id),
    -- md5 of the sources, in installation order.
    checksum     text        NOT NULL,
    -- The pgfifo release that installed them.
    release      text        NOT NULL,
    installed_at timestamptz NOT NULL DEFAULT now()
);

-- The pgfifo release of each runner (NULL: 0.1.0, which does not write it).
ALTER TABLE pgfifo.runner ADD COLUMN release text;

-- Reverts 0008_fair_shares. The functions stay: they use the shares only
-- while pgfifo.group_share exists, and weights then act as round robin
-- among ready groups until the next `migrate up`.
DROP TABLE IF EXISTS pgfifo.group_share;
-- The function set recorded as installed is no longer what is installed:
-- the next `migrate up` installs it again.
DELETE FROM pgfifo.schema_functions;

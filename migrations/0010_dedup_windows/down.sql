-- Reverts 0010_dedup_windows: the windows go. The functions stay as
-- installed (see docs/upgrading.md): those that use windows look for
-- pgfifo.job_window first, and an enqueue with a window raises a clear
-- error until `migrate up` brings the table back. add_job keeps its 0.3.0
-- signature (0008's down drops it with the rest of the SQL API).
DROP TABLE IF EXISTS pgfifo.job_window;
-- The function set recorded as installed is no longer what is installed:
-- the next `migrate up` installs it again.
DELETE FROM pgfifo.schema_functions;

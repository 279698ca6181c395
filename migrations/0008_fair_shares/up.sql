-- 0008_fair_shares: weights share starts by start-time fair queueing.
--
-- Each group of a queue with weights has a virtual time: the number of
-- starts it has had, each counted as 1 / its weight. A pick in such a
-- queue offers its ready groups lowest virtual time first, and every start
-- adds 1 / weight to its group's (pgfifo.charge_share, in the transaction
-- that records the attempt). So among groups that compete for slots, each
-- gets starts in proportion to its weight, whatever their number and
-- their concurrency. A group's time is never more than one unit (one start
-- of a weight-1 group) behind the queue's most advanced group: a group
-- that was idle, or could not use its share, gets at most that much back.
--
-- A table of its own, not a column of queue_group: that row is locked by
-- a group's running job, and the share is charged outside the job's
-- transaction. Rows of groups that retention deleted go with them.
CREATE TABLE pgfifo.group_share (
    queue    text             COLLATE "C" NOT NULL,
    group_id text             COLLATE "C" NOT NULL,
    vtime    double precision NOT NULL,
    PRIMARY KEY (queue, group_id)
);
-- The queue's most advanced group: the floor of every other group's time.
CREATE INDEX group_share_vtime_idx ON pgfifo.group_share (queue, vtime);

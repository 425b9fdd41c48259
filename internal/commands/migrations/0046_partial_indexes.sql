-- Schema version 46 (0046_partial_indexes.sql), the commands module's part: it
-- names only the commands module's tables. store.Migrate applies every
-- module's parts of a version in one transaction.

-- fanout_id and sent_session are NULL when a command is written (most
-- commands belong to no fan-out; none is sent yet), and every statement
-- that uses these indexes compares the column (=, IN), which implies NOT
-- NULL: indexing only the set values keeps the indexes from being written
-- on every insert (a warm claim's commit wrote their pages for nothing).
DROP INDEX commands_fanout;
CREATE INDEX commands_fanout ON commands(fanout_id) WHERE fanout_id IS NOT NULL;

DROP INDEX commands_sent_session;
CREATE INDEX commands_sent_session ON commands(sent_session) WHERE sent_session IS NOT NULL;

-- Schema version 26 (0026_fanout_id.sql), the commands module's part: it names
-- only the commands module's tables. A fan-out's commands share its id
-- (commands.fanout sets it; NULL for a command made alone), so they can be
-- listed and counted by state together.

ALTER TABLE commands ADD COLUMN fanout_id TEXT;
CREATE INDEX commands_fanout ON commands(fanout_id);

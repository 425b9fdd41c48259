-- Schema version 31 (0031_sent_session.sql), the commands module's part: it
-- names only the commands module's tables. sent_session is the gateway session
-- a sent command was written to (NULL while queued, and for rows sent before
-- this version). A sent command whose session ended, or was superseded by the
-- node's next Hello, before the node reported anything goes back to queued
-- (commands.RequeueEnded, commands.RequeueNode); the node's journal answers a
-- second delivery as a replay.

ALTER TABLE commands ADD COLUMN sent_session TEXT;

CREATE INDEX commands_sent_session ON commands(sent_session);

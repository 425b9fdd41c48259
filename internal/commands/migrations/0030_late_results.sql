-- Schema version 30 (0030_late_results.sql), the commands module's part: it
-- names only the commands module's tables. late is 1 when the command's
-- result arrived after the sweep had cancelled it as expired: the node
-- proved (a signed result that attests) that it ran the command, so its
-- result is recorded instead of the "expired" it replaced.

ALTER TABLE commands ADD COLUMN late INTEGER NOT NULL DEFAULT 0;

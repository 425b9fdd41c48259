-- Schema version 32 (0032_tickets.sql), the tickets module's part: it names
-- only the tickets module's tables. store.Migrate applies every module's part
-- of a version in one transaction, in the module order of
-- internal/store/modules.go.

-- The jtis of the tickets the gateways accepted: a ticket is used once, so
-- its jti is inserted on first use and a second insert is a replay. A row
-- is kept until tickets.Retention after expires_at_ms (Unix milliseconds),
-- then swept; by then the ticket is refused as expired anyway.

CREATE TABLE tickets_spent (
  jti            TEXT PRIMARY KEY,
  expires_at_ms  BIGINT NOT NULL
);

CREATE INDEX tickets_spent_expiry ON tickets_spent(expires_at_ms);

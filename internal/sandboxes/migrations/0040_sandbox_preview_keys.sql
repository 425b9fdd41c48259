-- Schema version 40 (0040_sandbox_preview_keys.sql), the sandboxes module's
-- part: the preview key (internal/sandboxes/previews). One row, slot
-- 'current': the Ed25519 seed sealed under the KEK (AAD binds it to its key
-- id), the public key in the clear (what the preview proxy verifies tokens
-- with) and its key id. Rotation replaces the row, so a token signed by the
-- old key no longer verifies anywhere.

CREATE TABLE sandbox_preview_keys (
  slot           TEXT PRIMARY KEY,
  kid            TEXT NOT NULL,
  sealed         BLOB NOT NULL,
  public_key     BLOB NOT NULL,
  created_at_ms  BIGINT NOT NULL
);

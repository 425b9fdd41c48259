-- Schema version 39 (0039_sandbox_checkpoints.sql), the sandboxes module's part:
-- it names only the sandboxes module's tables.

-- Checkpoints: a sandbox's writable layer (and, on runsc, its memory) as
-- content-addressed archives in the object store. A checkpoint belongs to
-- the sandbox's owner (owner_id), whoever took it, and records what it
-- must be restored under: its template and that template's image, runtime,
-- network mode and user as they were when it was taken. deleted_at marks
-- it gone for every caller; purged_at records that its objects were
-- removed (only once no live sandbox restores from them and no other
-- checkpoint holds the same digest). Times are unix ms.
CREATE TABLE sandbox_checkpoints (
  id            TEXT PRIMARY KEY,
  tenant_id     TEXT NOT NULL REFERENCES tenants(id),
  owner_id      TEXT NOT NULL,
  sandbox_id    TEXT NOT NULL,
  template_id   TEXT NOT NULL,
  image_digest  TEXT NOT NULL,
  runtime       TEXT NOT NULL,
  network       TEXT NOT NULL,
  run_as_root   INTEGER NOT NULL DEFAULT 0,
  digest        TEXT NOT NULL,
  size_bytes    BIGINT NOT NULL,
  memory_digest TEXT NOT NULL DEFAULT '',
  memory_size   BIGINT NOT NULL DEFAULT 0,
  taken_by      TEXT NOT NULL,
  created_at    BIGINT NOT NULL,
  deleted_at    BIGINT,
  purged_at     BIGINT
);

CREATE INDEX sandbox_checkpoints_owner ON sandbox_checkpoints(tenant_id, owner_id, created_at);

CREATE INDEX sandbox_checkpoints_digest ON sandbox_checkpoints(digest);

-- The checkpoint a sandbox was restored from ('' for none): its objects
-- are kept while the sandbox lives.
ALTER TABLE sandboxes ADD COLUMN from_checkpoint TEXT NOT NULL DEFAULT '';

-- What a sandbox's guest runs, as its signed create said: a checkpoint of
-- it records this, and a restore runs under it ('' for a sandbox started
-- before version 39, which cannot be checkpointed).
ALTER TABLE sandboxes ADD COLUMN image_digest TEXT NOT NULL DEFAULT '';

ALTER TABLE sandboxes ADD COLUMN network TEXT NOT NULL DEFAULT '';

ALTER TABLE sandboxes ADD COLUMN run_as_root INTEGER NOT NULL DEFAULT 0;

-- Schema version 27 (0027_lifecycle.sql), the nodes module's
-- part: it names only the nodes module's tables. store.Migrate applies every
-- module's part of a version in one transaction, in the module order of
-- internal/store/modules.go.

-- Schema version 27: a join token can be revoked before it is used
-- (join-tokens revoke, and a tenant's teardown). A revoked token's expiry
-- is moved to the revocation time as well, so Join and the quota count
-- treat it as expired without reading this column.
ALTER TABLE join_tokens ADD COLUMN revoked_at BIGINT;

-- A deleted node (nodes delete) keeps its row, so its certificates stay
-- for the attestation of the commands it ran, but no listing, lookup or
-- command target finds it again.
ALTER TABLE nodes ADD COLUMN deleted_at BIGINT;

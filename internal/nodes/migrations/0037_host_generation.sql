-- Schema version 37 (0037_host_generation.sql), the nodes module's part:
-- it names only the nodes module's tables. store.Migrate applies every
-- module's part of a version in one transaction, in the module order of
-- internal/store/modules.go.

-- host_generation numbers the host section of a node's signed desired
-- state (role and allowed kinds; issue 17). It goes up in the same
-- transaction as every change of the node's certificates' allowed kinds
-- (the role never changes), so a node and its root helper can refuse an
-- older desired state replayed.
ALTER TABLE nodes ADD COLUMN host_generation BIGINT NOT NULL DEFAULT 1;

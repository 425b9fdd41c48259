-- Schema version 46 (0046_warm_pool_order.sql), the sandboxes module's part:
-- it names only the sandboxes module's tables. store.Migrate applies every
-- module's parts of a version in one transaction.

-- A warm claim reads a template's oldest warm sandboxes (ORDER BY
-- created_at, id LIMIT 8): with the order in the index it reads those
-- eight, where it read and sorted the whole pool.
DROP INDEX sandboxes_template;
CREATE INDEX sandboxes_template ON sandboxes(template_id, state, created_at, id);

-- Schema version 43 (0043_sandbox_claim_confirm.sql), the sandboxes module's
-- part: it names only the sandboxes module's tables.

-- A warm claim answers before its host has applied the signed
-- sandbox.update that hands the sandbox to its tenant: claim_command is
-- that update's command id until the host's answer is confirmed ('' once
-- it is, and for every sandbox not claimed from a warm pool). A refused or
-- expired update fails the sandbox (the claim is refused back).
ALTER TABLE sandboxes ADD COLUMN claim_command TEXT NOT NULL DEFAULT '';

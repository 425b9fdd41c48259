-- Schema version 41 (0041_subject_tenant.sql), the commands module's part: it
-- names only the commands module's tables. subject_tenant is the tenant a
-- module's command on a fleet host works for ('' for every other command):
-- the sandboxes module sets it to a sandbox's tenant on the sandbox.create and
-- sandbox.update commands that carry its template's secret references, and
-- the secrets broker releases that tenant's secrets, named in the command's
-- env, to the host running the live command.

ALTER TABLE commands ADD COLUMN subject_tenant TEXT NOT NULL DEFAULT '';

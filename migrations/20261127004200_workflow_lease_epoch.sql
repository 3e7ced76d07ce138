-- Issue 23, fencing of workflow executions: the lease gets an epoch, bumped by every claim.
-- Every fenced write of a worker says `lease_owner = me AND lease_epoch = mine`, so a worker of
-- an earlier claim by the same replica (stalled while its lease ran out, then claimed again by
-- the same replica) writes nothing: `lease_owner = me` alone could not tell the two apart.
ALTER TABLE workflow_executions ADD COLUMN lease_epoch BIGINT NOT NULL DEFAULT 0;

-- Pause that keeps memory (issue 44): a gVisor sandbox's container can be checkpointed
-- (processes, open files and memory saved by the engine, `docker checkpoint create`) and
-- restored later on the same engine. Its dispatcher row says so while it is saved:
-- running -> checkpointed -> running (restored) or -> destroying (killed).
ALTER TABLE sandboxes DROP CONSTRAINT sandboxes_state_check;
ALTER TABLE sandboxes ADD CONSTRAINT sandboxes_state_check
    CHECK (state IN ('creating', 'running', 'checkpointed', 'destroying', 'destroyed', 'failed'));

-- The E2B door's pause of such a sandbox is still a `pause` snapshot row (its expiry and the
-- owner key's quota apply), whose archive is empty: what it keeps is the checkpoint of the
-- sandbox the E2B row names (`e2b_sandboxes.sandbox_id`), and `bytes` the memory it held.
ALTER TABLE e2b_snapshots ADD COLUMN keeps_memory BOOLEAN NOT NULL DEFAULT false;

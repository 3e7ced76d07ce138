-- What an E2B sandbox's timeout pause (`autoPause`) keeps: its memory where its class can
-- (gVisor, `checkpoint.rs`), unless it was created with `autoPauseMemory: false` (the SDK's
-- `lifecycle={"on_timeout": {"action": "pause", "keep_memory": False}}`): then its files only.
ALTER TABLE e2b_sandboxes ADD COLUMN pause_keeps_memory BOOLEAN NOT NULL DEFAULT true;

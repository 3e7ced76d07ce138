-- An E2B sandbox's own egress rules (`network.allowOut`/`denyOut`, `allow_internet_access`
-- folded in as `denyOut: 0.0.0.0/0`), as `{"allow_out": [...], "deny_out": [...]}`; its egress
-- proxy reads them for every connection, so `PUT /sandboxes/{id}/network` holds from the next
-- one. NULL: the sandbox has no network (its key's grant in `e2b.egress` is empty, or it asked
-- for none). Kept across pause and resume, copied to forks.
ALTER TABLE e2b_sandboxes ADD COLUMN egress JSONB;

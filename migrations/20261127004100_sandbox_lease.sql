-- Issue 23, takeover and fencing: holding a sandbox is a lease with an epoch.
--
-- `sandboxes.epoch` counts the holders a sandbox has had: it is 1 when the row is written and
-- goes up by one each time another holder claims the row (adoption, takeover, a replica taking
-- back what it dropped when its lease lapsed). Every write a holder makes on its row says
-- `AND instance_id = me AND epoch = mine`, so a replica that lost a sandbox changes nothing.
ALTER TABLE sandboxes ADD COLUMN epoch BIGINT NOT NULL DEFAULT 1;

-- When a peer found this instance silent past `dead_after` and fenced it off: from then on its
-- renewals fail (it must drop everything it held and rejoin), and its running sandboxes may be
-- taken over. Written in one conditional UPDATE that races the instance's own renewal on the
-- same row, so exactly one of "renewed" and "fenced" wins. NULL: not fenced.
ALTER TABLE node_instances ADD COLUMN fenced_at TIMESTAMPTZ;

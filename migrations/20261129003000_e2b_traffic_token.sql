-- A private E2B sandbox's traffic access token (create with `network.allow_public_traffic:
-- false`): a request to one of its ports must carry it in `e2b-traffic-access-token`. NULL: the
-- sandbox's ports are public (E2B's default). Kept as issued, like the envd token: it is
-- compared, and answered again on connect.
ALTER TABLE e2b_sandboxes ADD COLUMN traffic_access_token TEXT;

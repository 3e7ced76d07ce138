-- Where the replica's peers reach it (`cluster.advertise`): a call for a sandbox this instance
-- holds is forwarded there by the replica the caller reached. NULL: it takes no forwarded calls.
ALTER TABLE node_instances ADD COLUMN peer_url TEXT;

-- E2B's `autoResume: {enabled: true}` at create: a request to one of the sandbox's ports while
-- it is paused resumes it (as `connect()` would, as its owner key), then goes on to the port.
-- false (E2B's default): such a request is answered 409 "The sandbox is paused".
ALTER TABLE e2b_sandboxes ADD COLUMN auto_resume BOOLEAN NOT NULL DEFAULT false;
-- E2B's `network.maskRequestHost`: the `Host` the sandbox's servers see on requests to its
-- ports (`${PORT}` replaced by the port). NULL: the name the client used.
ALTER TABLE e2b_sandboxes ADD COLUMN mask_request_host TEXT;

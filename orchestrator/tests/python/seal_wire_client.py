"""An independent SEAL client that follows the Python SDK's wire contract exactly.

Written for the test suite from the SEAL notes (section 9), not from our Rust code: the same
dependencies as the public SDK (cryptography, requests), the same canonical bytes
(json.dumps(sort_keys=True, separators=(',', ':'), ensure_ascii=False) over payload, token and
integer Unix seconds), the same endpoints and the same reading of answers. If our gateway
works with this client, it works with the SDK.

Usage: python3 seal_wire_client.py BASE_URL WORKLOAD_ID SECURITY_CONTEXT
Prints one JSON object with the results; exits 1 on any failure.
"""

import base64
import json
import os
import sys
from datetime import datetime, timezone

import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


class SealError(Exception):
    pass


def canonical_message(payload, token, unix_seconds):
    message = {"payload": payload, "security_token": token, "timestamp": unix_seconds}
    return json.dumps(message, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class Client:
    def __init__(self, base, workload_id, context):
        self.base = base.rstrip("/")
        self.workload_id = workload_id
        self.context = context
        self.key = None
        self.token = None

    def attest(self):
        self.key = Ed25519PrivateKey.generate()
        raw = self.key.public_key().public_bytes(
            encoding=serialization.Encoding.Raw, format=serialization.PublicFormat.Raw
        )
        body = {
            "public_key": base64.b64encode(raw).decode("ascii"),
            "workload_id": self.workload_id,
            "security_context": self.context,
        }
        response = requests.post(self.base + "/v1/seal/attest", json=body, timeout=10)
        response.raise_for_status()
        data = response.json()
        if data.get("status") == "error":
            raise SealError("Attestation failed: " + str(data.get("message")))
        self.token = data["security_token"]
        return data

    def call_tool(self, name, arguments):
        payload = {
            "jsonrpc": "2.0",
            "id": "req-" + os.urandom(8).hex(),
            "method": "tools/call",
            "params": {"name": name, "arguments": arguments},
        }
        now = datetime.now(timezone.utc)
        timestamp = now.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        unix = int(datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp())
        signature = self.key.sign(canonical_message(payload, self.token, unix))
        envelope = {
            "protocol": "seal/v1",
            "security_token": self.token,
            "signature": base64.b64encode(signature).decode("ascii"),
            "payload": payload,
            "timestamp": timestamp,
        }
        response = requests.post(self.base + "/v1/seal/invoke", json=envelope, timeout=30)
        if not response.ok:
            data = response.json()
            if data.get("status") == "error":
                raise SealError("SEAL Gateway Rejected: " + data["error"]["message"])
            response.raise_for_status()
        data = response.json()
        if data.get("status") == "error":
            raise SealError("SEAL Gateway Rejected: " + data["error"]["message"])
        result_payload = data.get("payload", {})
        if "error" in result_payload:
            raise SealError("MCP Tool Error: " + json.dumps(result_payload["error"]))
        return result_payload.get("result", {})


def main():
    base, workload, context = sys.argv[1:4]
    client = Client(base, workload, context)
    attested = client.attest()
    wrote = client.call_tool("fs.write", {"path": "/workspace/hello.txt", "content": "héllo from python ✓\n"})
    read = client.call_tool("fs.read", {"path": "/workspace/hello.txt"})
    ran = client.call_tool("cmd.run", {"command": "cat /workspace/hello.txt"})
    refused = None
    try:
        client.call_tool("fs.read", {"path": "/etc/passwd"})
    except SealError as e:
        refused = str(e)
    print(json.dumps({
        "session_id": attested.get("session_id"),
        "write": wrote,
        "read": read,
        "run": ran,
        "refused": refused,
    }, ensure_ascii=False))


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # the test prints whatever went wrong
        print("FAILED: %r" % (e,), file=sys.stderr)
        sys.exit(1)

"""A DNS server for one wildcard name, for scripts/e2b_suite.sh: every A question for
`<domain>` or a name under it is answered with one address; any other question gets an empty
answer (AAAA, so resolvers fall back to A) or NXDOMAIN (other names). What a wildcard DNS entry
`*.<domain>` pointing at a node gives E2B's tests, which open `https://<port>-<id>.<domain>`,
without touching the machine's resolver: the suite runs pytest in a mount namespace of its own
whose /etc/resolv.conf names this server.

Usage: wildcard_dns.py <listen address> <domain> <answer address>   (UDP port 53; runs until
killed; prints "ready" on stdout once bound).
"""

import socket
import struct
import sys


def question(packet):
    """The query's id, flags, (name, type, class) and the question's bytes, or None."""
    if len(packet) < 12:
        return None
    ident, flags, qdcount = struct.unpack(">HHH", packet[:6])
    if qdcount != 1:
        return None
    labels, i = [], 12
    while True:
        if i >= len(packet):
            return None
        n = packet[i]
        i += 1
        if n == 0:
            break
        if n & 0xC0 or i + n > len(packet):
            return None
        labels.append(packet[i:i + n].decode("ascii", "replace").lower())
        i += n
    if i + 4 > len(packet):
        return None
    qtype, qclass = struct.unpack(">HH", packet[i:i + 4])
    return ident, flags, ".".join(labels), qtype, qclass, packet[12:i + 4]


def answer(packet, domain, address):
    q = question(packet)
    if q is None:
        return None
    ident, flags, name, qtype, qclass, raw = q
    ours = name == domain or name.endswith("." + domain)
    rd = flags & 0x0100
    # A response, authoritative, recursion desired copied, recursion available.
    rcode = 0 if ours else 3
    head = struct.pack(">HHHHHH", ident, 0x8000 | 0x0400 | rd | 0x0080 | rcode, 1,
                       1 if ours and qtype == 1 and qclass == 1 else 0, 0, 0)
    body = raw
    if ours and qtype == 1 and qclass == 1:
        # The name by pointer to the question, type A, class IN, TTL 5 s, the address.
        body += struct.pack(">HHHIH", 0xC00C, 1, 1, 5, 4) + socket.inet_aton(address)
    return head + body


def main():
    listen, domain, address = sys.argv[1], sys.argv[2].lower().strip("."), sys.argv[3]
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((listen, 53))
    print("ready", flush=True)
    while True:
        packet, peer = sock.recvfrom(4096)
        reply = answer(packet, domain, address)
        if reply is not None:
            sock.sendto(reply, peer)


if __name__ == "__main__":
    main()

"""Parses a Prometheus text exposition (stdin) with the official client's parser.

Prints one JSON object: {"families": {name: type}, "samples": [[name, labels, value], ...]}.
A document the parser rejects exits non-zero with the parser's message, which fails the test.
"""
import json
import sys

from prometheus_client.parser import text_string_to_metric_families

families = {}
samples = []
for family in text_string_to_metric_families(sys.stdin.read()):
    families[family.name] = family.type
    for s in family.samples:
        samples.append([s.name, s.labels, s.value])
json.dump({"families": families, "samples": samples}, sys.stdout)

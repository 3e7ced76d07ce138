#!/usr/bin/env python3
"""Self-check of the JSON Schemas in this folder and of the example manifests.

Usage: python3 schemas/check.py [-v]

Needs the PyPI packages `jsonschema` and `PyYAML` (pip install jsonschema pyyaml).

What it checks:
  1. every *.json schema is a valid draft 2020-12 schema (manifests, tool arguments, the
     `output` schemas in tools/index.json);
  2. lint: every property has a `description`; every object shape that lists properties is
     closed (`additionalProperties` given) unless it is a tagged union closed by its branches;
     the `$defs` shared by the two manifest schemas are identical; tools/index.json and the
     tools/*.json files name the same tools;
  3. examples/valid/*.yaml pass the schema and the semantic checks;
  4. examples/invalid/*.yaml fail the schema, and the JSON Pointers of the errors are exactly
     the one given on the file's first line `# expect: <pointer>`;
  5. examples/semantic/*.yaml pass the schema and fail the semantic checks exactly at the
     pointer given by `# expect-semantic: <gist> at <pointer>`.

Which schema an example is checked against comes from its file name: `agent-*.yaml` ->
agent/manifest/v1.json, `workflow-*.yaml` -> workflow/manifest/v1.json.

Error pointer convention (the Rust tests use the same): the instance location of the error,
except that for `required` the missing property's name is appended, and for
`additionalProperties: false` the unexpected property's name is appended. A forbidden property
expressed as a `false` subschema already points at the property.

The semantic checks below are a small reference of what the orchestrator checks after the
schema (cross references, reachability, ...); the Rust implementation is the one that counts.
"""

import json
import pathlib
import re
import sys

try:
    import jsonschema
    import yaml
except ImportError as exc:  # pragma: no cover - environment problem
    sys.exit(f"check.py needs jsonschema and PyYAML: pip install jsonschema pyyaml ({exc})")

ROOT = pathlib.Path(__file__).resolve().parent
VERBOSE = "-v" in sys.argv[1:]
Draft = jsonschema.Draft202012Validator


# ---------------------------------------------------------------------------------------------
# YAML loading that behaves like serde_yaml 0.9 (YAML 1.2 core schema) on the points that matter:
# only true/false are booleans (yes/no/on/off stay strings), no timestamp type, and duplicate
# keys are an error.


class Yaml12Loader(yaml.SafeLoader):
    pass


Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers
            if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:timestamp")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)


def _construct_mapping(loader, node, deep=False):
    loader.flatten_mapping(node)
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


Yaml12Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(path):
    with open(path, encoding="utf-8") as fh:
        return yaml.load(fh, Loader=Yaml12Loader)


# ---------------------------------------------------------------------------------------------
# helpers

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL " + msg)


def ok(msg):
    if VERBOSE:
        print("ok   " + msg)


def pointer(parts):
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def error_pointers(err):
    """JSON Pointers of one jsonschema error, per the convention in the module docstring."""
    base = list(err.absolute_path)
    if err.validator == "additionalProperties" and err.validator_value is False \
            and isinstance(err.instance, dict):
        props = err.schema.get("properties", {})
        pats = err.schema.get("patternProperties", {})
        extras = [k for k in err.instance
                  if k not in props and not any(re.search(p, k) for p in pats)]
        return [pointer(base + [k]) for k in extras] or [pointer(base)]
    if err.validator == "required" and isinstance(err.instance, dict):
        missing = [r for r in err.validator_value if r not in err.instance]
        for name in missing:  # python-jsonschema reports one error per missing property
            if err.message.startswith(repr(name)):
                return [pointer(base + [name])]
        return [pointer(base + [m]) for m in missing] or [pointer(base)]
    return [pointer(base)]


def schema_errors(validator, doc):
    errs = sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
    out = []
    for e in errs:
        for p in error_pointers(e):
            out.append((p, e.message))
    return out


# ---------------------------------------------------------------------------------------------
# 1 + 2: schemas


def walk_schema(node, where, visit):
    """Calls visit(subschema, where) for every subschema of a schema document."""
    if isinstance(node, dict):
        visit(node, where)
        for key, val in node.items():
            if key in ("properties", "patternProperties", "$defs", "dependentSchemas"):
                if isinstance(val, dict):
                    for k, sub in val.items():
                        walk_schema(sub, f"{where}/{key}/{k}", visit)
            elif key in ("allOf", "anyOf", "oneOf", "prefixItems"):
                for n, sub in enumerate(val):
                    walk_schema(sub, f"{where}/{key}/{n}", visit)
            elif key in ("items", "additionalProperties", "not", "if", "then", "else",
                         "contains", "propertyNames", "unevaluatedProperties"):
                walk_schema(val, f"{where}/{key}", visit)


def lint_schema(doc, name, closed=True):
    def described(sub):
        seen = set()
        while isinstance(sub, dict) and "description" not in sub and "$ref" in sub:
            ref = sub["$ref"]
            if not ref.startswith("#/$defs/") or ref in seen:
                return False
            seen.add(ref)
            sub = doc.get("$defs", {}).get(ref[len("#/$defs/"):])
        return isinstance(sub, dict) and "description" in sub

    def visit(node, where):
        if "/if" in where:
            return  # discriminator tests, not shapes
        last = where.rsplit("/", 1)[-1]
        if last in ("then", "else") and "type" not in node and "additionalProperties" not in node:
            return  # overlay that only forbids or narrows properties of the enclosing shape
        for prop, sub in (node.get("properties") or {}).items():
            if isinstance(sub, dict) and not described(sub):
                fail(f"{name}: property {where}/properties/{prop} has no description")
        if closed and "properties" in node and "additionalProperties" not in node:
            if not ("allOf" in node or "if" in node):  # tagged unions are closed by their branches
                fail(f"{name}: object shape at {where or '/'} is not closed")
    walk_schema(doc, "", visit)


def load_json(path):
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def check_schemas():
    schemas = {}
    for path in sorted(ROOT.rglob("*.json")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("examples/"):
            continue
        try:
            doc = load_json(path)
        except ValueError as exc:
            fail(f"{rel}: not JSON: {exc}")
            continue
        if rel == "tools/index.json":
            schemas[rel] = doc
            continue
        try:
            Draft.check_schema(doc)
            ok(f"{rel}: valid draft 2020-12 schema")
        except jsonschema.SchemaError as exc:
            fail(f"{rel}: invalid schema: {exc.message} at {pointer(exc.absolute_path)}")
            continue
        if doc.get("$schema") != "https://json-schema.org/draft/2020-12/schema":
            fail(f"{rel}: $schema must be draft 2020-12")
        lint_schema(doc, rel, closed=not rel.startswith("tools/aegis.tools."))
        schemas[rel] = doc

    agent = schemas.get("agent/manifest/v1.json")
    workflow = schemas.get("workflow/manifest/v1.json")
    if not agent or not workflow:
        fail("manifest schemas missing")
    else:
        for key in sorted(set(agent["$defs"]) & set(workflow["$defs"])):
            if agent["$defs"][key] != workflow["$defs"][key]:
                fail(f"$defs/{key} differs between the agent and workflow schemas")

    index = schemas.get("tools/index.json")
    if index is None:
        fail("tools/index.json missing")
    else:
        files = {p.stem for p in (ROOT / "tools").glob("*.json") if p.name != "index.json"}
        listed = set()
        for entry in index.get("tools", []):
            name = entry.get("name")
            listed.add(name)
            for field, kind in (("description", str), ("tier", str), ("skip_judge", bool),
                                ("input", str), ("output", dict)):
                if not isinstance(entry.get(field), kind):
                    fail(f"tools/index.json: {name}: `{field}` missing or not {kind.__name__}")
            if entry.get("tier") not in ("user", "system", "operator"):
                fail(f"tools/index.json: {name}: tier must be user, system or operator")
            if entry.get("input") != f"{name}.json":
                fail(f"tools/index.json: {name}: input must be {name}.json")
            try:
                Draft.check_schema(entry.get("output", {}))
            except jsonschema.SchemaError as exc:
                fail(f"tools/index.json: {name}: output is not a valid schema: {exc.message}")
            lint_schema(entry.get("output", {}), f"tools/index.json#{name}.output", closed=False)
            tool_doc = schemas.get(f"tools/{name}.json")
            if tool_doc is not None and tool_doc.get("title") != f"{name} arguments":
                fail(f"tools/{name}.json: title must be '{name} arguments'")
        for missing in sorted(files - listed):
            fail(f"tools/{missing}.json is not listed in tools/index.json")
        for missing in sorted(listed - files):
            fail(f"tools/index.json lists {missing} but tools/{missing}.json does not exist")
        ok(f"tools/index.json: {len(listed)} tools")
    return agent, workflow


# ---------------------------------------------------------------------------------------------
# semantic checks (reference for the Rust implementation)


def _schema_problems(schema, where):
    try:
        Draft.check_schema(schema)
        return []
    except jsonschema.SchemaError as exc:
        # Reported at the root of the embedded schema: which inner keyword a meta-schema
        # validator blames differs between implementations; the detail goes in the message.
        return [(where, f"not a valid JSON Schema: {exc.message} at {pointer(exc.absolute_path)}")]


def _under(path, root):
    path, root = path.rstrip("/") or "/", root.rstrip("/") or "/"
    return path == root or path.startswith(root if root == "/" else root + "/")


def semantic_agent(doc):
    errs = []
    spec = doc.get("spec", {})
    tools = spec.get("tools", [])
    cmd_caps = []
    for d, disp in enumerate(spec.get("builtin_dispatchers", [])):
        for c, cap in enumerate(disp.get("capabilities", [])):
            where = f"/spec/builtin_dispatchers/{d}/capabilities/{c}"
            if cap.get("name") == "cmd.run":
                cmd_caps.append(where)
    for extra in cmd_caps[1:]:
        errs.append((extra + "/name", "cmd.run is configured more than once"))
    # The reference node has no external MCP servers (`mcp_servers`): `mcp:<server>` names one.
    for t, tool in enumerate(tools):
        server = tool[len("mcp:"):].split("/")[0] if tool.startswith("mcp:") else None
        if server is not None and "." not in server:
            errs.append((f"/spec/tools/{t}", f"{tool} names an MCP server this node does not have"))
    if "cmd.run" in tools and not cmd_caps:
        errs.append((f"/spec/tools/{tools.index('cmd.run')}",
                     "cmd.run is offered but no builtin_dispatchers capability gives it a "
                     "subcommand_allowlist"))
    memory = spec.get("execution", {}).get("memory", False)
    memory_on = memory is True or (isinstance(memory, dict) and memory.get("enabled", True))
    for t, tool in enumerate(tools):
        if tool in ("aegis.memory.write", "aegis.memory.recall") and not memory_on:
            errs.append((f"/spec/tools/{t}", f"{tool} needs spec.execution.memory, which is off"))
    names, mounts = {}, []
    for v, vol in enumerate(spec.get("volumes", [])):
        if vol["name"] in names:
            errs.append((f"/spec/volumes/{v}/name", f"volume name '{vol['name']}' is used twice"))
        names[vol["name"]] = v
        mount = vol.get("mount_path", vol.get("mount_point"))  # mount_point: older spelling
        for other in mounts:
            if _under(mount, other) or _under(other, mount):
                errs.append((f"/spec/volumes/{v}/mount_path",
                             f"mount path overlaps {other}"))
                break
        mounts.append(mount)
    if "input_schema" in spec:
        errs += _schema_problems(spec["input_schema"], "/spec/input_schema")
    for n, val in enumerate(spec.get("execution", {}).get("validation", [])):
        where = f"/spec/execution/validation/{n}"
        if val.get("type") == "json_schema":
            errs += _schema_problems(val["schema"], where + "/schema")
        if val.get("type") == "multi_judge" and \
                val.get("min_judges_required", 1) > len(val["judges"]):
            errs.append((where + "/min_judges_required",
                         "min_judges_required exceeds the number of judges"))
    return errs


def semantic_workflow(doc):
    errs = []
    meta = doc.get("metadata", {})
    for key in ("input_schema", "output_schema"):
        if key in meta:
            errs += _schema_problems(meta[key], f"/metadata/{key}")
    spec = doc["spec"]
    states = spec["states"]
    initial = spec["initial_state"]
    if initial not in states:
        errs.append(("/spec/initial_state", f"initial_state '{initial}' is not a state"))
    shared = {v["name"] for v in spec.get("storage", {}).get("shared_volumes", [])}
    for name, st in states.items():
        where = f"/spec/states/{name}"
        after_always = False
        for t, tr in enumerate(st.get("transitions", [])):
            tw = f"{where}/transitions/{t}"
            if after_always:
                errs.append((tw, "transition follows an unconditional `always` and is never taken"))
            # A null target (`target: ~`) ends the run when taken.
            if tr["target"] is not None and tr["target"] not in states:
                errs.append((tw + "/target", f"transition target '{tr['target']}' is not a state"))
            cond = tr["condition"]
            if cond == "score_between" and tr["min"] > tr["max"]:
                errs.append((tw + "/min", "score_between min is greater than max"))
            if cond.startswith("input_equals") and st["kind"] != "Human":
                errs.append((tw + "/condition", f"{cond} is only meaningful on a Human state"))
            if cond == "always":
                after_always = True
        steps = []
        if st["kind"] == "ContainerRun":
            steps = [(where, st)]
        elif st["kind"] == "ParallelContainerRun":
            steps = [(f"{where}/steps/{i}", s) for i, s in enumerate(st["steps"])]
            seen = set()
            for sw, step in steps:
                if step["name"] in seen:
                    errs.append((sw + "/name", f"step name '{step['name']}' is used twice"))
                seen.add(step["name"])
        mounting = steps if steps else ([(where, st)] if st["kind"] in ("Agent", "System") else [])
        for sw, step in mounting:
            for v, vol in enumerate(step.get("volumes", [])):
                if vol["name"] != "workspace" and vol["name"] not in shared:
                    errs.append((f"{sw}/volumes/{v}/name",
                                 f"volume '{vol['name']}' is not declared in "
                                 "spec.storage.shared_volumes"))
        if st["kind"] == "ParallelContainerRun":
            writers = {}
            for sw, step in steps:
                for v, vol in enumerate(step.get("volumes", [])):
                    if not vol.get("read_only", False):
                        writers.setdefault(vol["name"], []).append(f"{sw}/volumes/{v}")
            for vol_name, ats in writers.items():
                if len(ats) > 1:
                    errs.append((ats[1], f"volume '{vol_name}' is written by parallel steps"))
        if st["kind"] == "ParallelAgents":
            cons = st["consensus"]
            if cons["strategy"] == "best_of_n" and cons["n"] > len(st["agents"]):
                errs.append((f"{where}/consensus/n", "best_of_n n exceeds the number of agents"))
    if initial in states:
        seen, todo = {initial}, [initial]
        while todo:
            for tr in states[todo.pop()].get("transitions", []):
                if tr["target"] in states and tr["target"] not in seen:
                    seen.add(tr["target"])
                    todo.append(tr["target"])
        for name in states:
            if name not in seen:
                errs.append((f"/spec/states/{name}", f"state '{name}' is unreachable from "
                                                      "initial_state"))
    return errs


# ---------------------------------------------------------------------------------------------
# 3-5: examples

EXPECT = re.compile(r"^# expect: (/\S*)\s*$")
EXPECT_SEMANTIC = re.compile(r"^# expect-semantic: (.+) at (/\S*)\s*$")


def check_examples(validators):
    counts = {}
    for group in ("valid", "invalid", "semantic"):
        files = sorted((ROOT / "examples" / group).glob("*.yaml"))
        counts[group] = len(files)
        for path in files:
            rel = path.relative_to(ROOT).as_posix()
            kind = path.name.split("-", 1)[0]
            if kind not in validators:
                fail(f"{rel}: file name must start with agent- or workflow-")
                continue
            try:
                doc = load_yaml(path)
            except yaml.YAMLError as exc:
                fail(f"{rel}: YAML error: {exc}")
                continue
            errs = schema_errors(validators[kind], doc)
            first = path.read_text(encoding="utf-8").splitlines()[0]
            sem = None
            if not errs:
                sem = semantic_agent(doc) if kind == "agent" else semantic_workflow(doc)
            if group == "valid":
                if errs:
                    fail(f"{rel}: should pass the schema: " + "; ".join(f"{p}: {m}" for p, m in errs))
                elif sem:
                    fail(f"{rel}: should pass the semantic checks: " +
                         "; ".join(f"{p}: {m}" for p, m in sem))
                else:
                    ok(rel)
            elif group == "invalid":
                m = EXPECT.match(first)
                if not m:
                    fail(f"{rel}: first line must be `# expect: <json pointer>`")
                    continue
                got = sorted({p for p, _ in errs})
                if not errs:
                    fail(f"{rel}: should fail the schema at {m.group(1)} but passes")
                elif got != [m.group(1)]:
                    fail(f"{rel}: expected errors only at {m.group(1)}, got: " +
                         "; ".join(f"{p}: {msg}" for p, msg in errs))
                else:
                    ok(f"{rel}: {m.group(1)}: {errs[0][1]}")
            else:
                m = EXPECT_SEMANTIC.match(first)
                if not m:
                    fail(f"{rel}: first line must be `# expect-semantic: <gist> at <json pointer>`")
                    continue
                if errs:
                    fail(f"{rel}: should pass the schema: " + "; ".join(f"{p}: {m}" for p, m in errs))
                    continue
                got = sorted({p for p, _ in sem})
                if got != [m.group(2)]:
                    fail(f"{rel}: expected one semantic error at {m.group(2)}, got: " +
                         ("; ".join(f"{p}: {msg}" for p, msg in sem) or "none"))
                else:
                    ok(f"{rel}: {m.group(2)}: {sem[0][1]}")
    return counts


def main():
    agent, workflow = check_schemas()
    counts = {}
    if agent and workflow:
        validators = {"agent": Draft(agent), "workflow": Draft(workflow)}
        counts = check_examples(validators)
    summary = ", ".join(f"{n} {g}" for g, n in counts.items())
    if failures:
        print(f"\n{len(failures)} problem(s); examples: {summary}")
        return 1
    print(f"all schemas valid; examples: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

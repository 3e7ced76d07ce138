"""Drives a code-interpreter-v1 sandbox for tests/suite/code_interpreter.rs.

Usage: code_interpreter_client.py <scenario>; environment: E2B_API_URL, E2B_SANDBOX_URL,
E2B_API_KEY (as for e2b_sdk_client.py). Prints one JSON report on stdout.

`inside`: makes the sandbox with E2B's SDK (`e2b`, unmodified), writes
code_interpreter_probe.py into it and runs it with `commands.run("python3 ...")` followed by
a scenario that talks HTTP to the code interpreter server on 127.0.0.1:49999 from inside the
sandbox (until a request reaches a sandbox's port from outside, this is how it is reached).
"""

import json
import os
import shlex
import sys
import time

from e2b import Sandbox

HERE = os.path.dirname(os.path.abspath(__file__))

# Runs inside the sandbox after the probe's definitions; prints one JSON report.
INSIDE = r'''
import base64
report = {}
report["health"] = call("GET", "/health")
report["listed_languages"] = sorted(c["language"] for c in json.loads(call("GET", "/contexts")[1]))
execute("x = 41")
r = execute("x + 1")
report["stateful"] = [l.get("text") for l in of(r, "result") if l["is_main_result"]]
report["counts"] = [l["execution_count"] for l in of(r, "number_of_executions")]
other = new_context()
r = execute("x", context_id=other["id"])
report["apart"] = [(l["name"], l["value"]) for l in of(r, "error")]
r = execute("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.title('t')")
pngs = [l["png"] for l in of(r, "result") if "png" in l]
report["plot_pngs"] = len(pngs)
report["plot_is_png"] = bool(pngs) and base64.b64decode(pngs[0])[:8] == b"\x89PNG\r\n\x1a\n"
r = execute("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})")
main = [l for l in of(r, "result") if l["is_main_result"]]
report["dataframe_html"] = bool(main) and "<table" in main[0].get("html", "")
r = execute("def f():\n    raise ValueError('boom')\nf()")
errors = of(r, "error")
report["error"] = [(e["name"], e["value"]) for e in errors]
report["traceback_names_f"] = bool(errors) and "f()" in errors[0]["traceback"] and "ValueError" in errors[0]["traceback"]
r = execute("import sys\nprint('out')\nprint('err', file=sys.stderr)")
report["streams"] = [stdout(r), "".join(l["text"] for l in of(r, "stderr"))]
r = execute("import os\nos.environ.get('FOO')", env={"FOO": "bar"})
report["env_set"] = [l.get("text") for l in of(r, "result")]
r = execute("os.environ.get('FOO', 'unset')")
report["env_after"] = [l.get("text") for l in of(r, "result")]
cwd = new_context(cwd="/tmp")
r = execute("import os\nos.getcwd()", context_id=cwd["id"])
report["cwd"] = [cwd["cwd"]] + [l.get("text") for l in of(r, "result")]
js = new_context("javascript")
execute("let y = 20", context_id=js["id"])
r = execute("console.log('from js'); y * 2 + 2", context_id=js["id"])
report["js"] = [stdout(r)] + [l.get("text") for l in of(r, "result")]
r = execute("null.x", context_id=js["id"])
report["js_error"] = [e["name"] for e in of(r, "error")]
sh = new_context("bash")
execute("Z=7; cd /tmp", context_id=sh["id"])
r = execute("echo $Z $(pwd)", context_id=sh["id"])
report["bash"] = stdout(r)
report["timeout"] = execute("import time\nwhile True: time.sleep(0.1)", timeout=3)
r = execute("x + 1")
report["after_timeout"] = [l.get("text") for l in of(r, "result")]
execute("z = 5", context_id=cwd["id"])
report["restart"] = call("POST", "/contexts/%s/restart" % cwd["id"])[0]
r = execute("z", context_id=cwd["id"])
report["after_restart"] = [e["name"] for e in of(r, "error")]
report["unknown_language"] = call("POST", "/contexts", {"language": "cobol"})[0]
report["unknown_context"] = execute("1", context_id="nope")
made = 0
while made < 20:
    status, _ = call("POST", "/contexts", {"language": "bash"})
    if status != 200:
        report["context_bound"] = [made, status]
        break
    made += 1
print(json.dumps(report))
'''


def inside():
    report = {}
    t0 = time.monotonic()
    sbx = Sandbox.create("code-interpreter-v1", timeout=300)
    report["create_ms"] = int((time.monotonic() - t0) * 1000)
    try:
        with open(os.path.join(HERE, "code_interpreter_probe.py"), encoding="utf-8") as f:
            probe = f.read()
        sbx.files.write("/home/user/ci_scenario.py", probe + "\n" + INSIDE)
        out = sbx.commands.run("python3 /home/user/ci_scenario.py", timeout=300)
        report["inside"] = json.loads(out.stdout)
    finally:
        sbx.kill()
    return report


def percentiles(samples):
    samples = sorted(samples)
    pick = lambda q: samples[min(len(samples) - 1, int(q * len(samples)))]
    return {"p50_ms": round(pick(0.5) * 1000, 1), "p95_ms": round(pick(0.95) * 1000, 1), "n": len(samples)}


CHART_CELLS = {
    "line": "import matplotlib.pyplot as plt\n"
    "plt.plot([0, 1, 2], [0, 1, 4], label='squares')\nplt.plot([0, 1, 2], [2, 2, 2], label='flat')\n"
    "plt.xlabel('Time (s)')\nplt.ylabel('Height')\nplt.title('Two lines')\nplt.show()",
    "bar": "import matplotlib.pyplot as plt\n"
    "plt.bar(['a', 'b', 'c'], [3, 1, 2], label='counts')\nplt.title('Three bars')\nplt.show()",
    "scatter": "import matplotlib.pyplot as plt\nplt.scatter([1, 2, 3, 4], [4, 3, 2, 1], label='dots')\nplt.show()",
    "pie": "import matplotlib.pyplot as plt\nplt.pie([3, 1], labels=['big', 'small'])\nplt.title('Pie')\nplt.show()",
    "box": "import matplotlib.pyplot as plt\nplt.boxplot([[1, 2, 3, 4, 5, 100]], labels=['one'])\nplt.show()",
    "super": "import matplotlib.pyplot as plt\nfig, axs = plt.subplots(1, 2)\nfig.suptitle('Both')\n"
    "axs[0].plot([1, 2])\naxs[1].bar(['x'], [1])\nplt.show()",
    "unknown": "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\n"
    "ax.add_artist(plt.Circle((0, 0), 1))\nplt.title('Circle')\nplt.show()",
}


def charts(sbx):
    """The `chart` E2B's SDK parses from each kind of figure, reduced to what the test checks."""
    out = {}
    for kind, code in CHART_CELLS.items():
        results = [r for r in sbx.run_code(code).results if r.chart is not None]
        if not results:
            out[kind] = None
            continue
        c = results[0].chart
        seen = {"type": c.type.value, "title": c.title}
        if kind in ("line", "scatter"):
            seen["x_unit"] = c.x_unit
            seen["elements"] = [[e.label, [list(p) for p in e.points]] for e in c.elements]
        elif kind == "bar":
            seen["elements"] = [[e.label, e.group, e.value] for e in c.elements]
        elif kind == "pie":
            seen["elements"] = [[e.label, e.angle] for e in c.elements]
        elif kind == "box":
            seen["elements"] = [
                [e.label, e.min, e.first_quartile, e.median, e.third_quartile, e.max, e.outliers]
                for e in c.elements
            ]
        elif kind == "super":
            seen["elements"] = [e.type.value for e in c.elements]
        else:
            seen["elements"] = c.elements
        out[kind] = seen
    return out


def sdk():
    """E2B's code-interpreter SDK (`e2b_code_interpreter`, unmodified) from outside, through the
    node's port route; PYTHONPATH names where it is installed (target/e2b-ci-sdk)."""
    from e2b import TimeoutException
    from e2b_code_interpreter import Sandbox as CodeSandbox

    report = {}
    t0 = time.monotonic()
    sbx = CodeSandbox.create(timeout=300)
    first = sbx.run_code("1+1")
    report["create_to_first_result_ms"] = int((time.monotonic() - t0) * 1000)
    report["first"] = first.text
    try:
        sbx.run_code("x = 41")
        report["stateful"] = sbx.run_code("x + 1").text
        other = sbx.create_code_context()
        apart = sbx.run_code("x", context=other)
        report["apart"] = [apart.error.name, apart.error.value] if apart.error else None
        plot = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])")
        # The figure as a PNG (a display, no plt.show()); the main result is plot()'s lines.
        report["plot_pngs"] = sum(1 for r in plot.results if r.png and not r.is_main_result)
        df = sbx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
        report["dataframe_html"] = bool(df.results) and "<table" in (df.results[0].html or "")
        err = sbx.run_code("def f():\n    raise ValueError('boom')\nf()")
        report["error"] = [err.error.name, err.error.value, "f()" in err.error.traceback]
        seen = {"stdout": [], "stderr": [], "result": [], "error": []}
        sbx.run_code(
            "import sys\nprint('out')\nprint('err', file=sys.stderr)\n7",
            on_stdout=lambda m: seen["stdout"].append(m.line),
            on_stderr=lambda m: seen["stderr"].append(m.line),
            on_result=lambda r: seen["result"].append(r.text),
            on_error=lambda e: seen["error"].append(e.name),
        )
        report["callbacks"] = seen
        report["charts"] = charts(sbx)
        report["dataframe_data"] = df.results[0].data if df.results else None
        report["ts"] = sbx.run_code("const n: number = 6 * 7; n", language="ts").text
        r_out = sbx.run_code("x <- c(1, 2, 3)\nsum(x)", language="r")
        report["r"] = [r_out.text, r_out.error.name if r_out.error else None]
        report["js"] = sbx.run_code("console.log('Hello, World!')", language="js").logs.stdout
        report["bash"] = sbx.run_code("echo $((6 * 7))", language="bash").logs.stdout
        # Java (our JShell driver): println's text and line end stream apart, as E2B's Java
        # kernel sends them; an expression's value; an env var of one run as a system property;
        # an exception's name; a timed-out loop stopped with the context's state kept.
        hello = sbx.run_code('System.out.println("Hello, World!")', language="java")
        value = sbx.run_code("int n = 6;\nn * 7", language="java")
        prop = sbx.run_code('System.getProperty("FOO")', language="java", envs={"FOO": "bar"})
        gone = sbx.run_code('System.getProperty("FOO", "unset")', language="java")
        thrown = sbx.run_code('Integer.parseInt("x")', language="java")
        try:
            sbx.run_code("while (true) { n = n; }", language="java", timeout=3)
            stopped = "no exception"
        except TimeoutException as e:
            stopped = type(e).__name__
        kept = sbx.run_code("n", language="java")
        report["java"] = [
            hello.logs.stdout, value.text, prop.text, gone.text,
            thrown.error.name if thrown.error else None, stopped, kept.text,
        ]
        try:
            sbx.run_code("import time\nwhile True: time.sleep(0.1)", timeout=3)
            report["timeout"] = "no exception"
        except TimeoutException as e:
            report["timeout"] = type(e).__name__
        report["after_timeout"] = sbx.run_code("x + 1").text
        contexts = sbx.list_code_contexts()
        report["contexts"] = sorted({c.language for c in contexts})
        sbx.restart_code_context(other)
        restarted = sbx.run_code("y = 1\ny", context=other)
        report["restarted"] = restarted.text
        sbx.remove_code_context(other)
        report["removed"] = other.id not in [c.id for c in sbx.list_code_contexts()]
        warm = []
        for _ in range(20):
            t = time.monotonic()
            sbx.run_code("1+1")
            warm.append(time.monotonic() - t)
        report["warm_run_code"] = percentiles(warm)
        cmd = []
        for _ in range(20):
            t = time.monotonic()
            sbx.commands.run("python3 -c 'print(1+1)'")
            cmd.append(time.monotonic() - t)
        report["commands_run_python"] = percentiles(cmd)
        # Paused and connected again: the files come back, the kernels do not, and the
        # server is up again before connect returns (its state starts afresh).
        sbx.files.write("/home/user/kept.txt", "kept")
        sbx.pause()
        sbx.connect(timeout=120)
        report["after_resume"] = sbx.run_code("open('/home/user/kept.txt').read()").text
        report["state_after_resume"] = sbx.run_code("x").error.name
    finally:
        sbx.kill()
    return report


if __name__ == "__main__":
    scenarios = {"inside": inside, "sdk": sdk}
    if len(sys.argv) != 2 or sys.argv[1] not in scenarios:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(scenarios)}")
    print(json.dumps(scenarios[sys.argv[1]]()))

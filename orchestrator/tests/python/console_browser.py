#!/usr/bin/env python3
"""Drives the operator console (/console) in a real browser: Debian's chromium through
chromium-driver and Selenium. Started by tests/suite/console.rs, which prepares the node and its
data through REST and passes them in the environment:

  CONSOLE_BASE      http://127.0.0.1:PORT
  ADMIN_KEY         an unbound admin key
  SECOND_KEY        an unbound operator key (approves the waiting call)
  SELF_KEY          the bound operator key whose call waits for approval
  SANDBOX_ID        a sandbox the admin key made, with a cmd.run in it
  PROC_PID          a background `cat` in that sandbox (its output is what is written to it)
  APPROVAL_ID       the waiting call's approval request
  WORKFLOW          a workflow whose run takes a few seconds (started here, through REST)
  SCREENSHOT_DIR    where the screenshots go (1400x1000)

Prints one JSON object on its last line: what each step saw, and the browser's console errors.
"""

import json
import os
import sys
import time
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

BASE = os.environ["CONSOLE_BASE"]
SHOTS = os.environ["SCREENSHOT_DIR"]
result = {"steps": {}, "console_errors": [], "screenshots": []}


def step(name, value):
    result["steps"][name] = value


def driver():
    options = webdriver.ChromeOptions()
    options.binary_location = os.environ.get("CHROMIUM_BIN", "/usr/bin/chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(os.environ.get("CHROMEDRIVER_BIN", "/usr/bin/chromedriver"))
    d = webdriver.Chrome(service=service, options=options)
    d.set_window_size(1400, 1000)
    d.set_page_load_timeout(60)
    return d


def collect_logs(d, refused=None, status=403):
    """Keeps the browser's errors; `refused` is a path this script asked for on purpose to be
    refused, whose `status` the browser logs as a failed load and which is no script error."""
    for entry in d.get_log("browser"):
        message = entry.get("message", "")
        if entry.get("level") != "SEVERE":
            continue
        if refused and refused in message and "status of %d" % status in message:
            continue
        result["console_errors"].append(message)


def shot(d, name):
    os.makedirs(SHOTS, exist_ok=True)
    path = os.path.join(SHOTS, name + ".png")
    d.save_screenshot(path)
    result["screenshots"].append(path)


def go(d, path, refused_with=None):
    """Opens a page; `refused_with` is the status it is expected to be answered with (not an
    error of the page's script)."""
    d.get(BASE + path)
    if refused_with:
        collect_logs(d, refused=path.split("?")[0], status=refused_with)
    else:
        collect_logs(d)


def fetch(d, path):
    """A GET from inside the signed-in page (its cookie, its origin): status, body text and
    Content-Disposition, as a click on a download link would receive them."""
    collect_logs(d)
    answer = d.execute_async_script(
        "var done = arguments[arguments.length - 1];"
        "fetch(arguments[0], {credentials: 'same-origin'}).then(function (r) {"
        " return r.text().then(function (t) {"
        "  done([r.status, t, r.headers.get('content-disposition') || '']); }); },"
        " function (e) { done([0, String(e), '']); });", path)
    collect_logs(d, refused=path.split("?")[0], status=answer[0])
    return answer


def rest(method, path, body, key=None):
    """A REST request as the admin key (what an agent does in its sandbox meanwhile)."""
    request = urllib.request.Request(
        BASE + path, data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": "Bearer " + (key or os.environ["ADMIN_KEY"]),
                 "Content-Type": "application/json"},
        method=method)
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.loads(r.read())


def text(d):
    return d.find_element(By.TAG_NAME, "body").text


def sign_in(d, key):
    go(d, "/console/sign-in")
    field = d.find_element(By.ID, "key")
    field.send_keys(key)
    d.find_element(By.CSS_SELECTOR, "form.signin button[type=submit]").click()
    WebDriverWait(d, 20).until(lambda d: "/console/sign-in" not in d.current_url)
    collect_logs(d)


def sign_out(d):
    d.find_element(By.ID, "sign-out").click()
    WebDriverWait(d, 20).until(lambda d: "/console/sign-in" in d.current_url)


def post_without_token(d, path):
    """A state-changing request from inside the signed-in page, without the form token."""
    collect_logs(d)
    status = d.execute_async_script(
        "var done = arguments[arguments.length - 1];"
        "fetch(arguments[0], {method: 'POST', body: new URLSearchParams({note: 'x'}),"
        " redirect: 'manual'}).then(function (r) { done(r.status); },"
        " function (e) { done(String(e)); });", path)
    collect_logs(d, refused=path)
    return status


def post_with_token(d, path, fields):
    """A form post with this session's token, read from the page's sign-out form."""
    collect_logs(d)
    answer = d.execute_async_script(
        "var done = arguments[arguments.length - 1];"
        "var token = document.querySelector('input[name=csrf]').value;"
        "var body = new URLSearchParams(arguments[1]); body.set('csrf', token);"
        "fetch(arguments[0], {method: 'POST', body: body, redirect: 'manual'})"
        ".then(function (r) { return r.text().then(function (t) { done([r.status, t]); }); },"
        " function (e) { done([0, String(e)]); });", path, fields)
    collect_logs(d, refused=path)
    return answer


def start_run():
    request = urllib.request.Request(
        BASE + "/v1/workflows/%s/run" % os.environ["WORKFLOW"],
        data=json.dumps({"input": {}}).encode(),
        headers={"Authorization": "Bearer " + os.environ["ADMIN_KEY"],
                 "Content-Type": "application/json"},
        method="POST")
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.loads(r.read())["execution_id"]


def main():
    d = driver()
    try:
        run(d)
    except Exception:
        result["at_failure"] = {"url": d.current_url, "text": text(d)[:2000]}
        raise
    finally:
        d.quit()


def run(d):
    if True:
        # 1. Without a session: nothing but the sign-in form.
        go(d, "/console/sandboxes")
        step("no_session_redirected", d.current_url.endswith("/console/sign-in"))
        step("no_session_shows_no_data", os.environ["SANDBOX_ID"] not in d.page_source)
        shot(d, "sign-in")

        # 2. Sign in as the admin key; the key is nowhere in the page or the URL.
        sign_in(d, os.environ["ADMIN_KEY"])
        step("signed_in_url", d.current_url)
        step("key_not_in_page", os.environ["ADMIN_KEY"] not in d.page_source
             and os.environ["ADMIN_KEY"] not in d.current_url)

        # 3. The sandbox made through REST, its page, and its cmd.run in the audit.
        step("sandbox_listed", os.environ["SANDBOX_ID"] in text(d))
        # Its CPU and memory, measured through REST and filled in by the page's script.
        row = "#sandboxes tr[data-id='%s'] " % os.environ["SANDBOX_ID"]
        try:
            WebDriverWait(d, 30, poll_frequency=0.2).until(
                lambda d: d.find_elements(By.CSS_SELECTOR, "#usage-live[data-rounds]"))
        except TimeoutException:
            pass
        step("sandbox_cpu", d.find_element(By.CSS_SELECTOR, row + "td[data-col='usage.cpu_used_pct']").text)
        step("sandbox_memory", d.find_element(By.CSS_SELECTOR, row + "td[data-col='usage.mem_used']").text)
        step("sandbox_replica", d.find_element(By.CSS_SELECTOR, row + "td[data-col='instance_id']").text)
        step("sandbox_engine", d.find_element(By.CSS_SELECTOR, row + "td[data-col='engine_name']").text)
        step("sandbox_class", d.find_element(By.CSS_SELECTOR, row + "td[data-col='spec.isolation']").text)
        shot(d, "sandboxes")
        go(d, "/console/sandboxes/" + os.environ["SANDBOX_ID"])
        body = text(d)
        step("sandbox_page_processes", "Processes" in body)
        step("sandbox_page_files", "hello.txt" in body)
        sandbox = os.environ["SANDBOX_ID"]
        pid = os.environ["PROC_PID"]
        process_page = "/console/sandboxes/%s/processes/%s" % (sandbox, pid)
        step("sandbox_page_process_link", len(d.find_elements(
            By.CSS_SELECTOR, "#processes a[href='%s']" % process_page)) == 1)
        shot(d, "sandbox")

        # 3b. The file downloads through fs.read, as the link in the files table gives it.
        link = d.find_element(By.LINK_TEXT, "hello.txt").get_attribute("href")
        status, content, disposition = fetch(d, link[len(BASE):])
        step("download_status", status)
        step("download_body", content)
        step("download_disposition", disposition)

        # 3c. The background process: what it wrote before, then what it writes while the page
        # is open, arriving without a reload.
        go(d, process_page)
        step("process_output_at_open", "before-the-page" in d.find_element(By.ID, "proc-stdout").text)
        rest("POST", "/v1/tools/call", {"name": "proc.input", "sandbox_id": sandbox,
                                        "arguments": {"pid": int(pid), "data": "while-you-watch\n"}})
        try:
            WebDriverWait(d, 30, poll_frequency=0.2).until(
                lambda d: "while-you-watch" in d.find_element(By.ID, "proc-stdout").text)
            step("process_output_live", True)
        except TimeoutException:
            step("process_output_live", False)
        shot(d, "process")
        go(d, "/console/audit?tool=cmd.run")
        rows = d.find_elements(By.CSS_SELECTOR, "#audit tbody tr")
        step("audit_cmd_run_rows", sum(1 for r in rows if "cmd.run" in r.text))
        shot(d, "audit")
        # The sandbox's own history, reached from its page: its rows and no other sandbox's.
        go(d, "/console/sandboxes/" + sandbox)
        d.find_element(By.ID, "sandbox-audit").click()
        WebDriverWait(d, 10).until(lambda d: "/console/audit" in d.current_url)
        cells = [c.text for c in d.find_elements(By.CSS_SELECTOR, "#audit td[data-col='sandbox_id']")]
        step("sandbox_audit_rows", len(cells))
        step("sandbox_audit_other_rows", sum(1 for c in cells if c != sandbox))
        step("sandbox_audit_cmd_run", sum(1 for r in d.find_elements(By.CSS_SELECTOR, "#audit tbody tr")
                                          if "cmd.run" in r.text))
        shot(d, "audit-sandbox")

        # 4. A workflow run advancing live to completion.
        run_id = start_run()
        go(d, "/console/runs/" + run_id)
        step("run_followed_live", len(d.find_elements(By.ID, "live")) == 1)
        # Events arrive through the node's SSE while the run goes on: the script adds them and
        # moves the current-state mark before the page is ever reloaded.
        marks = set()

        def steady(check):
            """The page reloads itself when the run ends: an element read across that is retried."""
            def wrapped(d):
                try:
                    return check(d)
                except StaleElementReferenceException:
                    return False
            return wrapped

        def live_events(d):
            for e in d.find_elements(By.CSS_SELECTOR, ".graph .state.current"):
                marks.add(e.get_attribute("data-state"))
            found = d.find_elements(By.CSS_SELECTOR, "#live[data-live-count]")
            return found and int(found[0].get_attribute("data-live-count")) > 0 and \
                d.find_elements(By.CSS_SELECTOR, "#events li.live")
        try:
            WebDriverWait(d, 60, poll_frequency=0.2).until(steady(live_events))
            step("run_events_arrived_live", True)
        except TimeoutException:
            step("run_events_arrived_live", False)
        shot(d, "run-live")
        try:
            def completed(d):
                for e in d.find_elements(By.CSS_SELECTOR, ".graph .state.current"):
                    marks.add(e.get_attribute("data-state"))
                found = d.find_elements(By.ID, "run-status")
                return found and found[0].text == "completed"
            WebDriverWait(d, 120, poll_frequency=0.2).until(steady(completed))
            step("run_completed_in_page", True)
        except TimeoutException:
            step("run_completed_in_page", False)
        # The status line and the graph's mark are separate updates of the page: a poll may see
        # "completed" before the last state is marked, so the marks are read a little longer.
        try:
            def last_marked(d):
                current = [e.get_attribute("data-state")
                           for e in d.find_elements(By.CSS_SELECTOR, ".graph .state.current")]
                marks.update(current)
                return "DONE" in current
            WebDriverWait(d, 10, poll_frequency=0.2).until(last_marked)
        except TimeoutException:
            pass
        collect_logs(d)
        step("run_states_marked", sorted(m for m in marks if m))
        step("run_current_state", [e.get_attribute("data-state")
                                   for e in d.find_elements(By.CSS_SELECTOR, ".state.current")])
        step("run_events", len(d.find_elements(By.CSS_SELECTOR, "#events li")))
        shot(d, "run")
        go(d, "/console/runs")
        step("runs_list_has_run", run_id in text(d))
        shot(d, "runs")

        # 5. Verify the chain.
        go(d, "/console/audit")
        d.find_element(By.ID, "verify").click()
        WebDriverWait(d, 30).until(lambda d: d.find_elements(By.ID, "verify-result"))
        step("verify_result", d.find_element(By.ID, "verify-result").text)
        shot(d, "audit-verify")

        # 6. Keys and the node (admin pages).
        go(d, "/console/keys")
        step("keys_page_lists_second", "second-person" in text(d))
        shot(d, "keys")
        go(d, "/console/node")
        step("node_ready", d.find_element(By.ID, "ready").text)
        step("node_replicas", len(d.find_elements(By.CSS_SELECTOR, "#replicas tbody tr")))
        step("node_metrics_rows", len(d.find_elements(By.CSS_SELECTOR, "#metrics tbody tr")))
        shot(d, "node")

        # 7. Every state-changing request without the form token is refused.
        refusals = {}
        for path in ("/console/sign-out", "/console/sandboxes/%s/destroy" % os.environ["SANDBOX_ID"],
                     "/console/approvals/%s/approve" % os.environ["APPROVAL_ID"],
                     "/console/runs/%s/cancel" % run_id, "/console/keys"):
            refusals[path] = post_without_token(d, path)
        step("without_token", refusals)
        sign_out(d)

        # 8. The key whose call waits cannot approve it (REST refuses; the console shows it).
        sign_in(d, os.environ["SELF_KEY"])
        go(d, "/console/approvals")
        step("self_approvals_page", text(d))
        step("self_approve_buttons", len(d.find_elements(By.ID, "approve-" + os.environ["APPROVAL_ID"])))
        status, page = post_with_token(d, "/console/approvals/%s/approve" % os.environ["APPROVAL_ID"],
                                       {"note": "my own"})
        step("self_approve_status", status)
        step("self_approve_refusal", "key_bound" in page or "own_call" in page)
        shot(d, "approvals-own")
        sign_out(d)

        # 9. A second person approves it; it cannot open the admin key's sandbox, its files or
        # its process (not found, as on REST).
        sign_in(d, os.environ["SECOND_KEY"])
        other = "/console/sandboxes/" + sandbox
        status, page, _ = fetch(d, other)
        step("other_sandbox_status", status)
        step("other_sandbox_shows_files", "hello.txt" in page)
        go(d, other, refused_with=404)
        shot(d, "sandbox-other-key")
        status, page, _ = fetch(d, other + "/file?path=/workspace/hello.txt")
        step("other_download_status", status)
        step("other_download_has_content", page == "hello")
        status, _, _ = fetch(d, process_page + "/output")
        step("other_output_status", status)
        go(d, "/console/approvals")
        shot(d, "approvals")
        d.find_element(By.ID, "approve-" + os.environ["APPROVAL_ID"]).click()
        WebDriverWait(d, 30).until(lambda d: d.find_elements(By.ID, "outcome"))
        step("second_approve_outcome", d.find_element(By.ID, "outcome").text)
        step("second_sees_no_keys_link", len(d.find_elements(By.LINK_TEXT, "Keys")) == 0)
        collect_logs(d)
        sign_out(d)

        # 10. Signed out: the session is gone.
        go(d, "/console/sandboxes")
        step("after_sign_out_redirected", d.current_url.endswith("/console/sign-in"))
        collect_logs(d)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # reported, so the Rust test shows what broke
        result["error"] = "%s: %s" % (type(e).__name__, e)
    print(json.dumps(result))
    sys.exit(0)

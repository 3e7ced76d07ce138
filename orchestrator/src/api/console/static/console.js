// The operator console's one script (served from /console/static, so the Content-Security-Policy
// can forbid inline code). On a run's page it follows the run's events live through the node's
// own Server-Sent Events, adds each event to the list and marks the state the run is in; when
// the run ends it reloads the page once, which then shows the final state from REST. On a
// process's page it asks the node for the process's new output (a long poll of proc.output
// through REST) and appends it, until the process has ended. On the sandboxes page it asks for
// what each sandbox uses every few seconds and fills in its CPU and memory.
"use strict";

(function () {
  function follow(live) {
    var url = live.getAttribute("data-events");
    if (!url || typeof EventSource === "undefined") {
      return;
    }
    var list = document.getElementById("events");
    var status = document.getElementById("run-status");
    var stateName = document.getElementById("run-state");
    var seen = 0;
    var source = new EventSource(url);
    source.addEventListener("events", function (message) {
      var events;
      try {
        events = JSON.parse(message.data);
      } catch (e) {
        return;
      }
      events.forEach(function (ev) {
        seen += 1;
        if (list) {
          var item = document.createElement("li");
          item.setAttribute("data-seq", String(ev.seq));
          item.className = "live";
          var type = document.createElement("span");
          type.className = "type";
          type.textContent = ev.event_type || "";
          var state = document.createElement("span");
          state.className = "state";
          state.textContent = ev.state_name || "";
          item.appendChild(type);
          item.appendChild(document.createTextNode(" "));
          item.appendChild(state);
          list.appendChild(item);
        }
        if (ev.state_name) {
          mark(ev.state_name);
          if (stateName) {
            stateName.textContent = ev.state_name;
          }
        }
        if (status && ev.event_type) {
          status.textContent = ev.event_type;
        }
      });
      live.setAttribute("data-live-count", String(seen));
      live.textContent = "Following live: " + seen + " new event(s).";
    });
    source.addEventListener("end", function () {
      source.close();
      live.textContent = "The run has ended.";
      window.location.reload();
    });
    source.onerror = function () {
      // The browser reconnects by itself; say so instead of failing silently.
      live.textContent = "Reconnecting to the event stream…";
    };
  }

  function mark(name) {
    var states = document.querySelectorAll(".graph .state");
    Array.prototype.forEach.call(states, function (el) {
      var current = el.getAttribute("data-state") === name;
      el.classList.toggle("current", current);
      if (current) {
        el.classList.add("visited");
        el.setAttribute("aria-current", "step");
      } else {
        el.removeAttribute("aria-current");
      }
    });
  }

  // One poll of a live part of a page: the JSON answer of the console's own route `url` (with
  // the session cookie) goes to `answered`, unless it names an error: then `live` says
  // `stopped` and the error, and polling ends.
  function pollJson(url, live, stopped, answered) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) {
        return r.json();
      })
      .then(function (out) {
        if (out.error) {
          live.textContent = stopped + out.error;
          return;
        }
        answered(out);
      });
  }

  function output(live) {
    var url = live.getAttribute("data-output");
    var status = document.getElementById("proc-status");
    var received = 0;
    var failures = 0;
    function append(stream, text) {
      var el = document.getElementById("proc-" + stream);
      if (el && text) {
        el.appendChild(document.createTextNode(text));
        received += text.length;
      }
    }
    function poll() {
      pollJson(url, live, "Stopped: ", function (out) {
        failures = 0;
        append("stdout", out.stdout);
        append("stderr", out.stderr);
        append("pty", out.pty);
        live.setAttribute("data-live-bytes", String(received));
        if (status && out.status) {
          status.textContent = out.status;
        }
        if (out.ended) {
          live.textContent = "The process has ended.";
          return;
        }
        live.textContent = "Following live: " + received + " new byte(s).";
        poll();
      }).catch(function () {
        // A dropped connection: try again a few times, slower each time, then say so.
        failures += 1;
        if (failures > 5) {
          live.textContent = "Lost the process's output; reload the page.";
          return;
        }
        live.textContent = "Reconnecting…";
        window.setTimeout(poll, 1000 * failures);
      });
    }
    poll();
  }

  function mib(bytes) {
    return (bytes / (1024 * 1024)).toFixed(1) + " MiB";
  }

  function usage(live) {
    var url = live.getAttribute("data-usage");
    var rounds = 0;
    function fill(id, u) {
      var row = null;
      Array.prototype.forEach.call(document.querySelectorAll("tr[data-id]"), function (tr) {
        if (tr.getAttribute("data-id") === id) {
          row = tr;
        }
      });
      if (!row) {
        return;
      }
      var cpu = row.querySelector("td[data-col='usage.cpu_used_pct']");
      var mem = row.querySelector("td[data-col='usage.mem_used']");
      if (cpu) {
        cpu.textContent = u ? u.cpu_used_pct.toFixed(1) + " % of " + u.cpu_count + " CPU" : "n/a";
      }
      if (mem) {
        mem.textContent = u ? mib(u.mem_used) + " of " + mib(u.mem_total) : "n/a";
      }
    }
    function poll() {
      pollJson(url, live, "CPU and memory: ", function (byId) {
        Object.keys(byId).forEach(function (id) {
          fill(id, byId[id]);
        });
        rounds += 1;
        live.setAttribute("data-rounds", String(rounds));
        live.textContent = "CPU and memory: measured " + new Date().toLocaleTimeString() + ".";
        window.setTimeout(poll, 5000);
      }).catch(function () {
        live.textContent = "CPU and memory: the node did not answer; retrying.";
        window.setTimeout(poll, 10000);
      });
    }
    poll();
  }

  document.addEventListener("DOMContentLoaded", function () {
    var usageLive = document.getElementById("usage-live");
    if (usageLive) {
      usage(usageLive);
    }
    var live = document.getElementById("live");
    if (live) {
      follow(live);
    }
    var procLive = document.getElementById("proc-live");
    if (procLive) {
      output(procLive);
    }
  });
})();

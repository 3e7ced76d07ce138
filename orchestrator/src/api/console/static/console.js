// The operator console's one script (served from /console/static, so the Content-Security-Policy
// can forbid inline code). On a run's page it follows the run's events live through the node's
// own Server-Sent Events, adds each event to the list and marks the state the run is in; when
// the run ends it reloads the page once, which then shows the final state from REST.
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

  document.addEventListener("DOMContentLoaded", function () {
    var live = document.getElementById("live");
    if (live) {
      follow(live);
    }
  });
})();

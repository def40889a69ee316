// relay console: the only script. Pages work without it; it adds the
// "select all" checkbox of the dead-letter list and the live tail. It
// never uses innerHTML: every value goes in as text.
"use strict";

document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("input[data-select-all]").forEach(function (all) {
    var name = all.getAttribute("data-select-all");
    all.addEventListener("change", function () {
      all.form.querySelectorAll('input[type=checkbox][name="' + name + '"]').forEach(function (box) {
        box.checked = all.checked;
      });
    });
  });

  var feed = document.getElementById("feed");
  if (feed && feed.dataset.src && window.EventSource) {
    live(feed);
  }
});

var maxRows = 200;

function live(feed) {
  var status = document.getElementById("live-status");
  var say = function (text, cls) {
    if (status) {
      status.textContent = text;
      status.className = "badge " + (cls || "");
    }
  };
  var src = new EventSource(feed.dataset.src);
  src.onopen = function () { say("live", "good"); };
  src.onerror = function () { say("reconnecting…", "warn"); };
  src.addEventListener("problem", function (e) { say("feed error: " + JSON.parse(e.data), "bad"); });
  src.addEventListener("recovered", function () { say("live", "good"); });
  src.addEventListener("outcome", function (e) {
    var ev = JSON.parse(e.data);
    var empty = document.getElementById("feed-empty");
    if (empty) {
      empty.remove();
    }
    feed.insertBefore(row(ev), feed.firstChild);
    while (feed.children.length > maxRows) {
      feed.removeChild(feed.lastChild);
    }
  });
}

function cell(tr, cls) {
  var td = document.createElement("td");
  if (cls) {
    td.className = cls;
  }
  tr.appendChild(td);
  return td;
}

function code(text) {
  var c = document.createElement("code");
  c.textContent = text;
  return c;
}

// link returns an anchor for a console-relative URL only.
function link(url, child) {
  if (typeof url !== "string" || url.charAt(0) !== "/" || url.charAt(1) === "/") {
    return child;
  }
  var a = document.createElement("a");
  a.setAttribute("href", url);
  a.appendChild(child);
  return a;
}

function row(ev) {
  var tr = document.createElement("tr");
  tr.className = "fresh " + ev.outcome;
  cell(tr).textContent = ev.time;
  var badge = document.createElement("span");
  badge.className = "badge " + ev.outcome;
  badge.textContent = ev.outcome;
  cell(tr).appendChild(badge);
  cell(tr).appendChild(code(ev.target));
  cell(tr).appendChild(link(ev.event_url, code(ev.message_id)));
  cell(tr, "n").textContent = ev.attempt;
  cell(tr, "n").textContent = ev.duration;
  var reason = cell(tr, "reason");
  if (ev.dlq_url) {
    var d = document.createElement("span");
    d.textContent = "dead letter";
    reason.appendChild(link(ev.dlq_url, d));
    reason.appendChild(document.createTextNode(" "));
  }
  reason.appendChild(document.createTextNode(ev.reason));
  return tr;
}

// The console's only script (the Content-Security-Policy allows no other).
// Every page works without it; it only keeps two things live:
//  - an element with data-live="URL" data-every="SECONDS" is replaced by
//    a fresh rendering of URL (the Queues page);
//  - a table with data-feed="URL" data-after="CURSOR" gets the events
//    after its cursor prepended (the Events page), the cursor moving on.
// The HTML it inserts is rendered, and escaped, by the server.
"use strict";
(function () {
  function status(id, ok) {
    document.querySelectorAll('.live-status[data-for="' + id + '"]').forEach(function (el) {
      el.textContent = ok ? "live · " + new Date().toTimeString().slice(0, 8) : "live: refresh failed, retrying";
      el.classList.toggle("failed", !ok);
    });
  }
  function get(url) {
    return fetch(url, { credentials: "same-origin", cache: "no-store" }).then(function (r) {
      if (!r.ok) throw new Error(r.status);
      return r;
    });
  }
  function refresh(el) {
    get(el.dataset.live)
      .then(function (r) { return r.text(); })
      .then(function (html) { el.innerHTML = html; status(el.id, true); })
      .catch(function () { status(el.id, false); })
      .finally(function () { setTimeout(function () { refresh(el); }, 1000 * Number(el.dataset.every || 5)); });
  }
  function follow(table) {
    var url = table.dataset.feed + (table.dataset.feed.indexOf("?") < 0 ? "?" : "&") + "after=" + table.dataset.after;
    get(url)
      .then(function (r) { return r.json(); })
      .then(function (page) {
        table.dataset.after = page.after;
        if (page.rows) {
          var body = table.tBodies[0];
          body.insertAdjacentHTML("afterbegin", page.rows);
          while (body.rows.length > 500) body.deleteRow(-1);
        }
        status("feed", true);
      })
      .catch(function () { status("feed", false); })
      .finally(function () { setTimeout(function () { follow(table); }, Number(table.dataset.everyMs || 2000)); });
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-live]").forEach(function (el) {
      setTimeout(function () { refresh(el); }, 1000 * Number(el.dataset.every || 5));
    });
    document.querySelectorAll("table[data-feed]").forEach(function (t) {
      setTimeout(function () { follow(t); }, Number(t.dataset.everyMs || 2000));
    });
  });
})();

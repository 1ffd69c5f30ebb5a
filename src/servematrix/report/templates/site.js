// The compatibility page's behaviour: filters (also read from the query string), sorting, copy buttons.
// Plain JS with no dependencies: the page must work opened from disk, with no server and no network.
(function () {
  "use strict";
  var params = new URLSearchParams(window.location.search);

  function versionKey(text) {
    // "0.5.10" after "0.5.9"; "pinned" and other words before numbers, as in the table's own order.
    return text.split(/[.+\-]/).map(function (part) {
      return /^\d+$/.test(part) ? [1, parseInt(part, 10)] : [0, part];
    });
  }

  function compareKeys(a, b) {
    for (var i = 0; i < Math.max(a.length, b.length); i++) {
      if (a[i] === undefined) return -1;
      if (b[i] === undefined) return 1;
      if (a[i][0] !== b[i][0]) return a[i][0] - b[i][0];
      if (a[i][1] < b[i][1]) return -1;
      if (a[i][1] > b[i][1]) return 1;
    }
    return 0;
  }

  function compareValues(type, a, b) {
    if (type === "num") return parseFloat(a) - parseFloat(b);
    if (type === "version") return compareKeys(versionKey(a), versionKey(b));
    return a.localeCompare(b);
  }

  function rowValue(row, key) {
    if (key === "mode") return row.getAttribute("data-mode");
    if (key === "verdict") return row.getAttribute("data-verdict");
    if (key === "regressed") return row.getAttribute("data-regressed");
    return row.getAttribute("data-axis-" + key);
  }

  function setupSection(section) {
    var controls = Array.prototype.slice.call(section.querySelectorAll("[data-filter]"));
    var body = section.querySelector("tbody");
    var rows = Array.prototype.slice.call(body.querySelectorAll("tr[data-cell]"));
    // Each cell's reproduce block is the row after it. Without JS every block stays visible.
    rows.forEach(function (row) {
      var detail = document.getElementById("repro-" + row.getAttribute("data-cell"));
      var button = row.querySelector("button.toggle");
      row.detail = detail;
      if (!detail || !button) return;
      detail.hidden = true;
      button.setAttribute("aria-expanded", "false");
      button.addEventListener("click", function () {
        var open = button.getAttribute("aria-expanded") !== "true";
        button.setAttribute("aria-expanded", open ? "true" : "false");
        detail.hidden = !open;
      });
    });
    var shown = section.querySelector("output.shown");

    controls.forEach(function (control) {
      var key = control.getAttribute("data-filter");
      if (!params.has(key)) return;
      var value = params.get(key);
      if (control.type === "checkbox") {
        control.checked = value === "1" || value === "true";
      } else if (control.tagName === "SELECT") {
        var known = Array.prototype.some.call(control.options, function (o) { return o.value === value; });
        if (!known && value) control.add(new Option(value, value)); // a filter that matches nothing says so
        control.value = value;
      } else {
        control.value = value;
      }
    });

    function apply() {
      var active = controls.map(function (c) {
        var value = c.type === "checkbox" ? (c.checked ? "1" : "") : c.value.trim();
        return { key: c.getAttribute("data-filter"), value: value };
      }).filter(function (f) { return f.value !== ""; });
      var count = 0;
      rows.forEach(function (row) {
        var visible = active.every(function (f) {
          if (f.key === "q") return row.textContent.toLowerCase().indexOf(f.value.toLowerCase()) >= 0;
          return rowValue(row, f.key) === f.value;
        });
        row.hidden = !visible;
        if (row.detail) {
          var button = row.querySelector("button.toggle");
          row.detail.hidden = !visible || !button || button.getAttribute("aria-expanded") !== "true";
        }
        if (visible) count++;
      });
      shown.value = count + " of " + rows.length + " cells";
      shown.setAttribute("data-shown", String(count));
      // A filter that matches nothing in this matrix says so, instead of an empty table.
      var none = section.querySelector("p.no-match");
      if (none) none.hidden = count > 0 || rows.length === 0;
      return active;
    }

    function remember(active) {
      var query = new URLSearchParams();
      active.forEach(function (f) { query.set(f.key, f.value); });
      var text = query.toString();
      try {
        window.history.replaceState(null, "", (text ? "?" + text : window.location.pathname) + window.location.hash);
      } catch (e) { /* some browsers refuse history changes on file:// pages; filtering still works */ }
    }

    controls.forEach(function (control) {
      var update = function () { remember(apply()); };
      control.addEventListener("input", update);
      control.addEventListener("change", update);
    });

    var headers = Array.prototype.slice.call(section.querySelectorAll("thead th"));
    headers.forEach(function (th, index) {
      th.addEventListener("click", function () {
        var type = th.getAttribute("data-type") || "text";
        var descending = th.getAttribute("aria-sort") === "ascending";
        headers.forEach(function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", descending ? "descending" : "ascending");
        var sorted = rows.slice().sort(function (a, b) {
          var x = a.children[index].getAttribute("data-value") || "";
          var y = b.children[index].getAttribute("data-value") || "";
          if (x === "" || y === "") return (x === "") - (y === ""); // empty cells last, either way
          var order = compareValues(type, x, y);
          return descending ? -order : order;
        });
        sorted.forEach(function (row) {
          body.appendChild(row);
          if (row.detail) body.appendChild(row.detail);
        });
      });
    });

    apply();
  }

  Array.prototype.forEach.call(document.querySelectorAll("section.matrix"), setupSection);

  Array.prototype.forEach.call(document.querySelectorAll("button.copy"), function (button) {
    button.addEventListener("click", function () {
      var text = button.getAttribute("data-copy");
      var done = function () { button.textContent = "copied"; };
      if (navigator.clipboard && navigator.clipboard.writeText) {
        navigator.clipboard.writeText(text).then(done, function () { window.prompt("copy:", text); });
      } else {
        window.prompt("copy:", text);
      }
    });
  });

  function openTarget() {
    var id = window.location.hash.slice(1);
    var target = id && document.getElementById(id);
    if (target && target.tagName === "TR" && target.hasAttribute("data-cell")) {
      target.hidden = false;
      target.classList.add("target");
      var button = target.querySelector("button.toggle");
      if (button && button.getAttribute("aria-expanded") !== "true") button.click();
      target.scrollIntoView();
    }
  }
  window.addEventListener("hashchange", openTarget);
  openTarget();
  document.documentElement.setAttribute("data-ready", "1");
  // For people and tests alike: how many plots the browser could actually decode.
  window.addEventListener("load", function () {
    var images = Array.prototype.slice.call(document.querySelectorAll("figure.plot img"));
    var drawn = images.filter(function (img) { return img.complete && img.naturalWidth > 0; }).length;
    document.documentElement.setAttribute("data-plots", drawn + "/" + images.length);
  });
})();

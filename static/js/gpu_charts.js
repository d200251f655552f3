// The job page's GPU charts, live (templates/web/_gpu_charts.html, drawn first by the server
// in apps/telemetry/charts.py): while the job runs, its event stream's `gpu` events carry new
// samples, and each GPU's chart is drawn again the same way (utilisation on the left axis, %,
// memory on the right, MiB, UTC clock times below). SVG attributes only: no inline style.
(function () {
  "use strict";

  var NS = "http://www.w3.org/2000/svg";

  function niceCeiling(value) {
    if (value <= 1) { return 1; }
    var power = Math.pow(10, Math.floor(Math.log10(value)));
    var steps = [1, 2, 5, 10];
    for (var i = 0; i < steps.length; i++) {
      if (steps[i] * power >= value) { return Math.round(steps[i] * power); }
    }
    return Math.round(10 * power);
  }

  function clock(t) {
    return new Date(t * 1000).toISOString().substring(11, 19);
  }

  function el(parent, name, attrs, text) {
    var node = document.createElementNS(NS, name);
    Object.keys(attrs).forEach(function (key) { node.setAttribute(key, attrs[key]); });
    if (text !== undefined) { node.textContent = text; }
    parent.appendChild(node);
    return node;
  }

  function draw(svg, points) {
    var g = svg.dataset.geometry.split(",").map(Number);
    var left = g[0], right = g[1], top = g[2], bottom = g[3];
    var height = svg.viewBox.baseVal.height;
    var t0 = points[0][0], t1 = points[points.length - 1][0];
    var span = Math.max(t1 - t0, 1);
    var most = niceCeiling(Math.max.apply(null, points.map(function (p) { return p[2]; }).concat([1])));
    var x = function (t) { return (left + (t - t0) / span * (right - left)).toFixed(1); };
    var y = function (v, max) { return (bottom - v / max * (bottom - top)).toFixed(1); };
    while (svg.firstChild) { svg.removeChild(svg.firstChild); }
    var axes = el(svg, "g", { "class": "axes", stroke: "#9ca3af", "stroke-width": "1" });
    el(axes, "line", { x1: left, y1: top, x2: left, y2: bottom });
    el(axes, "line", { x1: right, y1: top, x2: right, y2: bottom });
    el(axes, "line", { x1: left, y1: bottom, x2: right, y2: bottom });
    var ticksY = el(svg, "g", { "class": "ticks-y", "font-size": "11", fill: "#4b5563" });
    [0, 0.5, 1].forEach(function (f) {
      var at = bottom - f * (bottom - top);
      el(ticksY, "line", { x1: left, x2: right, y1: at, y2: at, stroke: "#e5e7eb" });
      el(ticksY, "text", { "class": "tick-util", x: left - 4, y: at, "text-anchor": "end",
        "dominant-baseline": "middle" }, Math.round(100 * f) + "%");
      el(ticksY, "text", { "class": "tick-memory", x: right + 4, y: at, "text-anchor": "start",
        "dominant-baseline": "middle" }, Math.round(most * f) + " MiB");
    });
    var ticksX = el(svg, "g", { "class": "ticks-x", "font-size": "11", fill: "#4b5563" });
    [0, 0.5, 1].forEach(function (f, i) {
      el(ticksX, "text", { x: x(t0 + f * span), y: height - 6,
        "text-anchor": ["start", "middle", "end"][i] }, clock(t0 + f * span));
    });
    el(svg, "polyline", { "class": "line-memory", fill: "none", stroke: "#d97706", "stroke-width": "1.5",
      "stroke-dasharray": "4 3", points: points.map(function (p) { return x(p[0]) + "," + y(p[2], most); }).join(" ") });
    el(svg, "polyline", { "class": "line-util", fill: "none", stroke: "#2563eb", "stroke-width": "2",
      points: points.map(function (p) { return x(p[0]) + "," + y(p[1], 100); }).join(" ") });
  }

  function start(card) {
    var job = card.dataset.job;
    var series = {};  // "node:index" -> [[t, util, memory_mib], ...]
    var dirty = false;

    function add(samples) {
      samples.forEach(function (s) {
        var key = s.node + ":" + s.index;
        var t = Date.parse(s.t) / 1000;
        var points = series[key] = series[key] || [];
        if (!points.length || t > points[points.length - 1][0]) {
          points.push([t, s.util, s.memory_mib]);
          if (points.length > 1000) { points.shift(); }
        }
      });
      if (!dirty) {
        dirty = true;
        window.requestAnimationFrame(redraw);
      }
    }

    var refreshing = false;

    function refresh() {
      // A GPU with no chart yet (the page was drawn before its first sample): the server draws
      // the card again, and the stream's samples are drawn into it from then on.
      refreshing = true;
      fetch(window.location.href, { credentials: "same-origin" })
        .then(function (response) { return response.text(); })
        .then(function (html) {
          var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("gpu-charts");
          if (fresh) { card.innerHTML = fresh.innerHTML; }
          window.setTimeout(function () { refreshing = false; redraw(); }, 2000);
        })
        .catch(function () { refreshing = false; });
    }

    function redraw() {
      dirty = false;
      var shown = {};
      card.querySelectorAll("figure.gpu-chart").forEach(function (figure) {
        shown[figure.dataset.node + ":" + figure.dataset.index] = true;
      });
      if (!refreshing && Object.keys(series).some(function (key) { return !shown[key]; })) {
        refresh();
      }
      card.querySelectorAll("figure.gpu-chart").forEach(function (figure) {
        var points = series[figure.dataset.node + ":" + figure.dataset.index];
        if (!points || !points.length) { return; }
        draw(figure.querySelector("svg"), points);
        var last = points[points.length - 1];
        var now = figure.querySelector(".gpu-now");
        if (now) { now.textContent = Math.round(last[1]) + "%, " + last[2] + " MiB"; }
      });
    }

    fetch("/api/v1/jobs/" + job + "/metrics/", { credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.json() : { samples: [] }; })
      .then(function (body) {
        add(body.samples);
        var stream = new EventSource("/api/v1/jobs/" + job + "/events/");
        stream.addEventListener("gpu", function (event) { add(JSON.parse(event.data).samples); });
        stream.addEventListener("end", function () { stream.close(); });
      })
      .catch(function () { /* the server's drawing stays */ });
  }

  function init() {
    var card = document.getElementById("gpu-charts");
    if (card && card.dataset.live === "1" && window.EventSource && window.fetch) { start(card); }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", init);
  } else {
    init();
  }
})();

// The job page's terminal (docs/interactive.md): opens a shell session on an interactive job
// (POST /api/v1/jobs/{id}/sessions/, the page's CSRF token) and joins xterm.js to its websocket.
// Frames: 0x00 + data, 0x01 + JSON control ({"resize": [rows, cols]} out; {"exit"}, {"error"} in).
(function () {
  "use strict";
  var button = document.getElementById("terminal-open");
  var status = document.getElementById("terminal-status");
  if (!button) return;
  if (typeof Terminal === "undefined") {
    button.disabled = true;
    status.textContent = "The in-page terminal is not installed here (npm); use gpuplatform shell.";
    return;
  }
  var encoder = new TextEncoder();

  function frame(kind, bytes) {
    var out = new Uint8Array(bytes.length + 1);
    out[0] = kind;
    out.set(bytes, 1);
    return out;
  }

  function csrf() {
    try {
      return JSON.parse(document.body.getAttribute("hx-headers"))["X-CSRFToken"];
    } catch (e) {
      return "";
    }
  }

  button.addEventListener("click", function () {
    button.disabled = true;
    var term = new Terminal({ rows: 30, cols: 100, convertEol: false });
    term.open(document.getElementById("terminal"));
    var body = { kind: "shell", tty: true, rows: term.rows, cols: term.cols, term: "xterm-256color" };
    fetch("/api/v1/jobs/" + button.dataset.job + "/sessions/", {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": csrf() },
      body: JSON.stringify(body),
    }).then(function (answer) {
      return answer.json().then(function (data) {
        if (!answer.ok) throw new Error(JSON.stringify(data));
        return data;
      });
    }).then(function (opened) {
      var scheme = location.protocol === "https:" ? "wss://" : "ws://";
      var ws = new WebSocket(scheme + location.host + opened.url + "?ticket=" + encodeURIComponent(opened.ticket));
      ws.binaryType = "arraybuffer";
      ws.onopen = function () { status.textContent = "connected"; term.focus(); };
      ws.onmessage = function (event) {
        var data = new Uint8Array(event.data);
        if (data[0] === 0) {
          term.write(data.subarray(1));
        } else if (data[0] === 1) {
          var control = JSON.parse(new TextDecoder().decode(data.subarray(1)));
          if ("exit" in control) status.textContent = "the shell exited " + control.exit;
          if ("error" in control) status.textContent = control.error;
        }
      };
      ws.onclose = function (event) {
        if (status.textContent === "connected") status.textContent = "session ended: " + (event.reason || event.code);
      };
      term.onData(function (text) {
        if (ws.readyState === WebSocket.OPEN) ws.send(frame(0, encoder.encode(text)));
      });
      term.onResize(function (size) {
        if (ws.readyState === WebSocket.OPEN) {
          ws.send(frame(1, encoder.encode(JSON.stringify({ resize: [size.rows, size.cols] }))));
        }
      });
    }).catch(function (error) {
      status.textContent = "could not open a session: " + error.message;
      button.disabled = false;
    });
  });
})();

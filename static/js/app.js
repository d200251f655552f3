// The pages' one script, a file so the Content-Security-Policy allows no inline script:
// bar widths and chart heights from data attributes (a style attribute would need
// 'unsafe-inline'), the confirm question of forms that ask one, and log boxes that follow their
// newest lines. Runs on load and on every piece htmx swaps in.
(function () {
  "use strict";

  // A log box (<pre data-follow id=...>) shows its end and keeps showing it as lines come in,
  // until the reader scrolls up; scrolling back to the end follows again. htmx replaces the box
  // on every poll, so where the reader was is noted before the swap and applied right after it,
  // in the same task (htmx:afterSwap). Not at htmx:load: that fires when the swap settles, 20 ms
  // later, and a scroll made in between would be undone by the position noted before it.
  var NEAR_END = 24; // pixels: at the end, give or take a line
  var logs = {};
  var placed = new WeakSet(); // boxes already given their position

  function note(el) {
    logs[el.id] = {
      follow: el.scrollHeight - el.scrollTop - el.clientHeight < NEAR_END,
      top: el.scrollTop,
    };
  }

  function remember(root) {
    root.querySelectorAll("pre[data-follow][id]").forEach(note);
  }

  function follow(root) {
    root.querySelectorAll("pre[data-follow]").forEach(function (el) {
      if (placed.has(el)) {
        return;
      }
      placed.add(el);
      var was = logs[el.id];
      el.scrollTop = !was || was.follow ? el.scrollHeight : was.top;
    });
  }

  function apply(root) {
    root.querySelectorAll("[data-width]").forEach(function (el) {
      el.style.width = Number(el.dataset.width) + "%";
    });
    root.querySelectorAll("[data-height]").forEach(function (el) {
      el.style.height = Number(el.dataset.height) + "%";
    });
    follow(root);
  }

  document.addEventListener("submit", function (event) {
    var form = event.target.closest("form[data-confirm]");
    if (form && !window.confirm(form.dataset.confirm)) {
      event.preventDefault();
    }
  });
  document.addEventListener("htmx:beforeSwap", function (event) {
    remember(event.detail.target);
  });
  document.addEventListener("htmx:afterSwap", function (event) {
    follow(event.target);
  });
  // And at every scroll (scroll events do not bubble: caught on the way down), so a scroll that
  // lands on a box just swapped in, before htmx has handed it over, still counts.
  document.addEventListener("scroll", function (event) {
    var el = event.target;
    if (el instanceof Element && el.isConnected && el.matches("pre[data-follow][id]")) {
      note(el);
    }
  }, true);

  if (window.htmx) {
    window.htmx.onLoad(apply);
  } else {
    document.addEventListener("DOMContentLoaded", function () { apply(document); });
  }
})();

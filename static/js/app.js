// The pages' one script, a file so the Content-Security-Policy allows no inline script:
// bar widths and chart heights from data attributes (a style attribute would need
// 'unsafe-inline'), and the confirm question of forms that ask one. Runs on load and on every
// piece htmx swaps in.
(function () {
  "use strict";

  function apply(root) {
    root.querySelectorAll("[data-width]").forEach(function (el) {
      el.style.width = Number(el.dataset.width) + "%";
    });
    root.querySelectorAll("[data-height]").forEach(function (el) {
      el.style.height = Number(el.dataset.height) + "%";
    });
  }

  document.addEventListener("submit", function (event) {
    var form = event.target.closest("form[data-confirm]");
    if (form && !window.confirm(form.dataset.confirm)) {
      event.preventDefault();
    }
  });

  if (window.htmx) {
    window.htmx.onLoad(apply);
  } else {
    document.addEventListener("DOMContentLoaded", function () { apply(document); });
  }
})();

// Site-wide behaviour, loaded on every page (no inline scripts: the Content-Security-Policy
// allows scripts only from our static files).
(function () {
  "use strict";
  // <form data-confirm="Question?">: ask before a destructive or irreversible action.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form instanceof HTMLFormElement && form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
      event.preventDefault();
    }
  });
})();

// Ask before a form with data-confirm is sent (closing a campaign, recording verdicts).
// A listener rather than an inline onsubmit, so it works under a Content-Security-Policy.
(function () {
  "use strict";
  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form && form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) event.preventDefault();
  });
})();

// Site-wide behaviour, loaded on every page (no inline scripts: the Content-Security-Policy
// allows scripts only from our static files).
// A job's status badge, from the API's value ("RUNNING"): the word people read ("Running", as
// the server renders it), the value in data-status for scripts, the status-* class for colour.
window.setStatusBadge = function (badge, status) {
  badge.dataset.status = status;
  badge.textContent = status.charAt(0) + status.slice(1).toLowerCase();
  badge.className = badge.className.replace(/\bstatus-\S+/, "").trim() + " status-" + status.toLowerCase();
};

// Whether a job's status ("RUNNING") means it is still to finish: the server's one list of such
// statuses, handed over by base.html (<body data-active-statuses>; jobs.models.ACTIVE_STATUSES).
window.jobIsActive = function (status) {
  return (document.body.dataset.activeStatuses || "").split(" ").indexOf(status) >= 0;
};

// Text for a Plotly label or legend: Plotly reads a subset of HTML in its strings (<a href>,
// <b>, <br>...), so a name someone chose (a model's display name) has its markup escaped and is
// shown as written, never as a link. Plotly turns the entities back into the characters.
window.plotText = function (text) {
  return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
};

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

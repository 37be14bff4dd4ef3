// Jobs page: live status, progress, attempts and reason of every listed job (polls /api/jobs/).
(function () {
  "use strict";
  var table = document.getElementById("job-table");
  if (!table) return;

  // The same words as jobs.selectors.duration_text: "45 s", "3 min 05 s", "2 h 04 min".
  function durationText(seconds) {
    if (seconds === null || seconds === undefined) return "";
    var whole = Math.round(seconds), hours = Math.floor(whole / 3600), minutes = Math.floor((whole % 3600) / 60);
    var pad = function (n) { return (n < 10 ? "0" : "") + n; };
    if (hours) return hours + " h " + pad(minutes) + " min";
    return minutes ? minutes + " min " + pad(whole % 60) + " s" : whole + " s";
  }

  function render(job) {
    var row = document.getElementById("job-" + job.type + "-" + job.id);
    if (!row) return false;
    window.setStatusBadge(row.querySelector(".job-status"), job.status);
    var bar = row.querySelector(".job-progress");
    bar.max = Math.max(job.progress.total, 1);
    bar.value = job.progress.done;
    row.querySelector(".job-progress-text").textContent = job.progress.done + " / " + job.progress.total;
    row.querySelector(".job-attempts").textContent = job.attempts;
    row.querySelector(".job-duration").textContent = durationText(job.duration_seconds);
    row.querySelector(".job-error").textContent = job.error || "";
    row.querySelector(".job-cancel").hidden = !job.can_cancel;
    row.querySelector(".job-retry").hidden = !job.can_retry;
    return window.jobIsActive(job.status);
  }

  function poll() {
    fetch(table.dataset.apiUrl, {headers: {"Accept": "application/json"}, credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
      .then(function (data) {
        var active = data.results.map(render).some(Boolean);
        setTimeout(poll, active ? 2000 : 10000);
      })
      .catch(function () { setTimeout(poll, 5000); });
  }

  poll();
})();

// Live progress of a construction build (build_detail.html).
(function () {
  "use strict";
  var box = document.getElementById("stages");
  function show(counts) {
    var total = counts.total || 0;
    box.querySelectorAll("progress[data-stage]").forEach(function (bar) {
      bar.max = Math.max(total, 1); bar.value = counts[bar.dataset.stage] || 0;
    });
    box.querySelectorAll("[data-count]").forEach(function (el) { el.textContent = counts[el.dataset.count] || 0; });
  }
  show(JSON.parse(document.getElementById("build-counts").textContent));
  function poll() {
    fetch(box.dataset.statusUrl, {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (r) { return r.json(); })
      .then(function (b) {
        show(b.counts); window.setStatusBadge(document.getElementById("build-status"), b.status);
        document.getElementById("progress-text").textContent = b.progress_text || "";
        if (window.jobIsActive(b.status)) setTimeout(poll, 2000); else window.location.reload();
      }).catch(function () { setTimeout(poll, 5000); });
  }
  if (box.dataset.active) poll();
})();

// Submission page: live progress of runs (polls the API) and the per-domain chart.
(function () {
  "use strict";
  var runs = document.getElementById("runs");

  // A run's reason as text, the site's own submission pages ("see /submissions/7/") as links:
  // the template filter link_submissions, built from nodes (never HTML from the server).
  function showReason(node, text) {
    node.textContent = "";
    text.split(/(?<!\S)(\/submissions\/\d+\/)(?=\s|$|[.,;:)](?:\s|$))/).forEach(function (part, i) {
      if (i % 2) {
        var a = document.createElement("a");
        a.href = part;
        a.textContent = part;
        node.appendChild(a);
      } else if (part) {
        node.appendChild(document.createTextNode(part));
      }
    });
  }

  function render(submission) {
    var anyActive = false;
    submission.runs.forEach(function (run) {
      var box = document.getElementById("run-" + run.id);
      if (!box) return;
      var bar = box.querySelector(".run-progress");
      bar.max = Math.max(run.progress.total, 1);
      bar.value = run.progress.done;
      box.querySelector(".run-progress-text").textContent =
        run.progress.done + " of " + run.progress.total + " pairs scored";
      window.setStatusBadge(box.querySelector(".run-status"), run.status);
      var error = box.querySelector(".run-error");
      showReason(error, run.error || "");
      error.hidden = !run.error;
      if (window.jobIsActive(run.status)) anyActive = true;
    });
    return anyActive;
  }

  function poll(wasActive) {
    fetch(runs.dataset.statusUrl, {headers: {"Accept": "application/json"}, credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
      .then(function (submission) {
        var active = render(submission);
        if (active) { setTimeout(function () { poll(true); }, 2000); }
        else if (wasActive) { window.location.reload(); }  // show the finished results
      })
      .catch(function () { setTimeout(function () { poll(wasActive); }, 5000); });
  }

  if (runs && Array.prototype.some.call(runs.querySelectorAll(".run-status"), function (b) {
    return window.jobIsActive(b.dataset.status);
  })) {
    poll(true);
  }

  var dataNode = document.getElementById("chart-data");
  if (dataNode && window.Plotly) {
    var data = JSON.parse(dataNode.textContent);
    var labels = JSON.parse(document.getElementById("domain-labels").textContent);
    var domains = Object.keys(labels);
    var traces = data.map(function (run) {
      var acc = domains.map(function (d) { return run.by_domain[d] ? 100 * run.by_domain[d].accuracy : null; });
      var hi = domains.map(function (d, i) { return run.by_domain[d] ? 100 * run.by_domain[d].ci_high - acc[i] : 0; });
      var lo = domains.map(function (d, i) { return run.by_domain[d] ? acc[i] - 100 * run.by_domain[d].ci_low : 0; });
      return {type: "bar", name: run.setting, x: domains.map(function (d) { return labels[d]; }), y: acc,
              error_y: {type: "data", symmetric: false, array: hi, arrayminus: lo}};
    });
    Plotly.newPlot("domain-chart", traces, {
      barmode: "group", xaxis: {title: {text: "Domain"}, automargin: true},
      yaxis: {title: {text: "Accuracy (%)"}, range: [0, 100], automargin: true},
      margin: {t: 30, r: 20}, legend: {orientation: "h", y: -0.3},
      shapes: [{type: "line", xref: "paper", x0: 0, x1: 1, y0: 50, y1: 50, line: {dash: "dot", color: "#888"}}]
    }, {responsive: true, displaylogo: false});
  }

  var scalingNode = document.getElementById("scaling-data");
  if (scalingNode && window.Plotly) {
    // Accuracy against m (chains for the user), one line per n (similar users consulted).
    var traces = [];
    JSON.parse(scalingNode.textContent).forEach(function (run) {
      var byN = {};
      run.points.forEach(function (p) { (byN[p.n] = byN[p.n] || []).push(p); });
      Object.keys(byN).forEach(function (n) {
        var pts = byN[n].sort(function (a, b) { return a.m - b.m; });
        traces.push({type: "scatter", mode: "lines+markers", name: run.setting + ", n=" + n,
                     x: pts.map(function (p) { return p.m; }),
                     y: pts.map(function (p) { return p.accuracy === null ? null : 100 * p.accuracy; })});
      });
    });
    Plotly.newPlot("scaling-chart", traces, {xaxis: {title: {text: "m (evaluation chains)"}, dtick: 1, automargin: true},
      yaxis: {title: {text: "Accuracy (%)"}, automargin: true}, margin: {t: 20, r: 20}, legend: {orientation: "h", y: -0.3}},
      {responsive: true, displaylogo: false});
  }
})();

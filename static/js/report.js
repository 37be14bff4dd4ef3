// Campaign report charts (plotly.js served from static/).
(function () {
  "use strict";
  var node = document.getElementById("report-data");
  if (!node || !window.Plotly) return;
  var report = JSON.parse(node.textContent);
  var dims = JSON.parse(document.getElementById("dimension-data").textContent);
  var labels = dims.map(function (d) { return plotText(d.label); });  // staff-written: shown as text
  var config = {responsive: true, displaylogo: false};
  var COLORS = {chosen: "#4f46e5", rejected: "#f59e0b"};

  function bars(role, summaries, x) {
    var y = summaries.map(function (s) { return s ? s[role + "_mean"] : null; });
    var ci = summaries.map(function (s) { return s && s[role + "_ci"] ? s[role + "_ci"] : null; });
    return {
      type: "bar", name: role === "chosen" ? "Chosen" : "Rejected", x: x, y: y, marker: {color: COLORS[role]},
      error_y: {type: "data", symmetric: false,
                array: ci.map(function (c, i) { return c ? c[1] - y[i] : 0; }),
                arrayminus: ci.map(function (c, i) { return c ? y[i] - c[0] : 0; })}
    };
  }

  var overall = dims.map(function (d) { return (report.dimensions[d.key] || {}).overall; });
  Plotly.newPlot("chart-dimensions", [bars("chosen", overall, labels), bars("rejected", overall, labels)], {
    barmode: "group", yaxis: {title: {text: "Mean rating (1-5)"}, range: [0, 5.5]}, margin: {t: 20},
    legend: {orientation: "h"}
  }, config);

  var domains = {};
  dims.forEach(function (d) {
    Object.keys((report.dimensions[d.key] || {}).by_domain || {}).forEach(function (dom) { domains[dom] = true; });
  });
  var domainLabels = JSON.parse(document.getElementById("domain-labels").textContent);
  var domainTraces = dims.map(function (d) {
    var doms = Object.keys(domains);
    return {type: "bar", name: plotText(d.label), x: doms.map(function (dom) { return plotText(domainLabels[dom] || dom); }),
            y: doms.map(function (dom) { var s = report.dimensions[d.key].by_domain[dom]; return s ? s.mean_diff : null; })};
  });
  Plotly.newPlot("chart-domains", domainTraces, {
    barmode: "group", yaxis: {title: {text: "Chosen − rejected (mean)"}}, margin: {t: 20}, legend: {orientation: "h"}
  }, config);

  var values = ["1", "2", "3", "4", "5"];
  var distTraces = [];
  ["chosen", "rejected"].forEach(function (role) {
    values.forEach(function (v, i) {
      distTraces.push({
        type: "bar", name: "Rating " + v, legendgroup: v,
        showlegend: role === "chosen", x: labels.map(function (l) { return l + (role === "chosen" ? " · C" : " · R"); }),
        y: dims.map(function (d) { return ((report.distribution[d.key] || {})[role] || {})[v] || 0; }),
        marker: {color: ["#b91c1c", "#f97316", "#facc15", "#84cc16", "#15803d"][i]}
      });
    });
  });
  Plotly.newPlot("chart-distribution", distTraces, {
    barmode: "stack", yaxis: {title: {text: "Ratings"}}, margin: {t: 20, b: 110}, legend: {title: {text: "Rating"}},
    xaxis: {tickangle: -30}
  }, config);
})();

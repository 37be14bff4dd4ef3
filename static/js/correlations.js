// Correlation dashboard: accuracy vs outcome per RM with a fit line, correlation bars, Best-of-N curves.
(function () {
  "use strict";
  var node = document.getElementById("correlation-data");
  if (!node || !window.Plotly) return;
  var report = JSON.parse(node.textContent);
  var config = {responsive: true, displaylogo: false};
  var wide = document.getElementById("chart-scatter").clientWidth >= 600;
  var label = function (r) { return r.benchmark + (r.setting ? " · " + r.setting : ""); };

  var scatter = [];
  report.correlations.forEach(function (r) {
    if (!r.points.length) return;
    var xs = r.points.map(function (p) { return 100 * p.accuracy; });
    var ys = r.points.map(function (p) { return p.outcome; });
    // Names beside the points only where there is room; always in the hover. Alternating
    // above/below keeps neighbouring names from overprinting each other.
    scatter.push({type: "scatter", mode: wide ? "markers+text" : "markers", name: label(r), x: xs, y: ys,
                  textposition: r.points.map(function (p, i) { return i % 2 ? "bottom center" : "top center"; }),
                  text: r.points.map(function (p) { return p.rm; }), textfont: {size: 10}, cliponaxis: false,
                  hovertemplate: "%{text}<br>accuracy %{x:.1f}%<br>outcome %{y:.3f}<extra></extra>"});
    if (xs.length >= 2) {  // least-squares fit line
      var n = xs.length, mx = xs.reduce(function (a, b) { return a + b; }) / n,
          my = ys.reduce(function (a, b) { return a + b; }) / n, sxy = 0, sxx = 0;
      for (var i = 0; i < n; i++) { sxy += (xs[i] - mx) * (ys[i] - my); sxx += (xs[i] - mx) * (xs[i] - mx); }
      if (sxx > 0) {
        var slope = sxy / sxx, lo = Math.min.apply(null, xs), hi = Math.max.apply(null, xs);
        scatter.push({type: "scatter", mode: "lines", name: label(r) + " fit", showlegend: false,
                      x: [lo, hi], y: [my + slope * (lo - mx), my + slope * (hi - mx)], line: {dash: "dot"}});
      }
    }
  });
  Plotly.newPlot("chart-scatter", scatter, {
    xaxis: {title: {text: "Benchmark accuracy (%)"}, automargin: true},
    yaxis: {title: {text: "Downstream outcome (0-2)"}, automargin: true},
    margin: {t: 30, r: 20}, legend: {orientation: "h", y: -0.25}}, config);

  var rows = report.correlations.filter(function (r) { return r.spearman.value !== null; });
  var metric = function (key, name) {
    var withCi = rows.map(function (r) { return r[key].ci_low !== null; });
    return {type: "bar", name: name, x: rows.map(label), y: rows.map(function (r) { return r[key].value; }),
            error_y: {type: "data", symmetric: false, visible: withCi.some(Boolean),
              array: rows.map(function (r) { return r[key].ci_high === null ? 0 : r[key].ci_high - r[key].value; }),
              arrayminus: rows.map(function (r) { return r[key].ci_low === null ? 0 : r[key].value - r[key].ci_low; })}};
  };
  Plotly.newPlot("chart-bars", [metric("spearman", "Spearman ρ"), metric("kendall", "Kendall τ-b"),
                                metric("weighted_tau", "Weighted τ"), metric("pearson", "Pearson r"),
                                metric("ndcg", "NDCG"), metric("rbo", "RBO")], {
    barmode: "group", xaxis: {title: {text: "Benchmark · setting"}, automargin: true},
    yaxis: {title: {text: "Correlation with the outcome"}, range: [-1, 1], automargin: true},
    margin: {t: 20, r: 20}, legend: {orientation: "h", y: -0.35}}, config);

  var curves = document.getElementById("chart-curves");
  if (curves) {
    var traces = Object.keys(report.curves).map(function (rm) {
      var pts = report.curves[rm];
      return {type: "scatter", mode: "lines+markers", name: rm, x: pts.map(function (p) { return p.k; }),
              y: pts.map(function (p) { return p.outcome; })};
    });
    Plotly.newPlot(curves, traces, {xaxis: {title: {text: "k (answers sampled)"}, type: "log",
                                            tickvals: [1, 2, 4, 8, 16], automargin: true},
                                    yaxis: {title: {text: "Outcome (0-2)"}, automargin: true}, margin: {t: 20, r: 20},
                                    legend: {orientation: "h", y: -0.3}}, config);
  }
})();

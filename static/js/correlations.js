// Correlation dashboard: accuracy vs outcome per RM with a fit line, correlation bars, Best-of-N curves.
(function () {
  "use strict";
  var node = document.getElementById("correlation-data");
  if (!node || !window.Plotly) return;
  var report = JSON.parse(node.textContent);
  var config = {responsive: true, displaylogo: false};
  var settingLabels = JSON.parse(document.getElementById("setting-labels").textContent);
  // Only the charts with something to show are on the page (the view decides).
  var scatterNode = document.getElementById("chart-scatter"), barsNode = document.getElementById("chart-bars");
  var wide = (scatterNode || barsNode || document.getElementById("correlation-table")).clientWidth >= 600;
  var label = function (r) {  // on a phone the setting goes on a second line: narrower tick labels
    return plotText(r.benchmark) + (r.setting ? (wide ? " · " : "<br>") +
                                    plotText((settingLabels[r.setting] || r.setting).toLowerCase()) : "");
  };
  // Legends sit above the plot: below it they collided with the x-axis title once tick labels
  // grew. Axis titles wrap on a phone so they never run past the plot's height or width.
  var legend = {orientation: "h", x: 0, xanchor: "left", y: 1.02, yanchor: "bottom"};
  var title = function (long, narrow) { return {text: wide ? long : narrow}; };
  // The figures' precision: the table's (_metric.html), so a value and its CI agree everywhere.
  var DIGITS = {ndcg: 3, ndcg_shifted: 3, rbo: 3};
  var fmt = function (v, d) { return v === null ? "—" : v.toFixed(d); };

  var scatter = [];
  report.correlations.forEach(function (r) {
    if (!r.points.length) return;
    var xs = r.points.map(function (p) { return 100 * p.accuracy; });
    var ys = r.points.map(function (p) { return p.outcome; });
    // Names beside the points only where there is room; always in the hover. Alternating
    // above/below keeps neighbouring names from overprinting each other.
    scatter.push({type: "scatter", mode: wide ? "markers+text" : "markers", name: label(r), x: xs, y: ys,
                  textposition: r.points.map(function (p, i) { return i % 2 ? "bottom center" : "top center"; }),
                  text: r.points.map(function (p) { return plotText(p.rm); }), textfont: {size: 10}, cliponaxis: false,
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
  if (scatterNode) Plotly.newPlot(scatterNode, scatter, {
    xaxis: {title: {text: "Benchmark accuracy (%)"}, automargin: true},
    yaxis: {title: title("Downstream outcome (0-2)", "Downstream<br>outcome (0-2)"), automargin: true},
    margin: {t: 30, r: 20}, legend: legend}, config);

  var rows = report.correlations.filter(function (r) { return r.spearman.value !== null; });
  var metric = function (key, name) {
    var withCi = rows.map(function (r) { return r[key].ci_low !== null; });
    var d = DIGITS[key] || 2;
    return {type: "bar", name: name, x: rows.map(label), y: rows.map(function (r) { return r[key].value; }),
            text: rows.map(function (r) {
              return fmt(r[key].value, d) + (r[key].ci_low === null ? "" : " [" + fmt(r[key].ci_low, d) + ", " +
                                             fmt(r[key].ci_high, d) + "]");
            }),
            textposition: "none", hovertemplate: "%{x}<br>" + name + " %{text}<extra></extra>",
            error_y: {type: "data", symmetric: false, visible: withCi.some(Boolean),
              array: rows.map(function (r) { return r[key].ci_high === null ? 0 : r[key].ci_high - r[key].value; }),
              arrayminus: rows.map(function (r) { return r[key].ci_low === null ? 0 : r[key].value - r[key].ci_low; })}};
  };
  if (barsNode) Plotly.newPlot(barsNode, [metric("spearman", "Spearman ρ"), metric("kendall", "Kendall τ-b"),
                                metric("weighted_tau", "Weighted τ"), metric("pearson", "Pearson r"),
                                metric("ndcg", "NDCG"), metric("rbo", "RBO")], {
    barmode: "group", height: wide ? 380 : 460,
    xaxis: {title: {text: "Benchmark · setting"}, automargin: true},
    yaxis: {title: title("Correlation with the outcome", "Correlation<br>with outcome"), range: [-1, 1],
            automargin: true},
    margin: {t: 20, r: 20}, legend: legend}, config);

  var curves = document.getElementById("chart-curves");
  if (curves) {
    var traces = Object.keys(report.curves).map(function (rm) {
      var pts = report.curves[rm];
      return {type: "scatter", mode: "lines+markers", name: plotText(rm), x: pts.map(function (p) { return p.k; }),
              y: pts.map(function (p) { return p.outcome; })};
    });
    Plotly.newPlot(curves, traces, {xaxis: {title: {text: "k (answers sampled)"}, type: "log",
                                            tickvals: [1, 2, 4, 8, 16], automargin: true},
                                    yaxis: {title: {text: "Outcome (0-2)"}, automargin: true}, margin: {t: 20, r: 20},
                                    legend: legend}, config);
  }
})();

/* stepscope fleet page: the largest lag of each step, drawn with uPlot from the page's JSON. */
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("stepscope-fleet").textContent);
  var target = document.getElementById("lag-chart");
  document.body.dataset.rendered = "true"; /* what the browser tests wait for */
  if (!data.step.length || typeof uPlot === "undefined") {
    target.textContent = "no steps";
    return;
  }
  new uPlot(
    {
      width: Math.max(400, target.clientWidth || 900),
      height: 260,
      scales: { x: { time: false } },
      axes: [{ label: "step" }, { label: "ms" }],
      series: [
        { label: "step" },
        {
          label: "largest lag (ms)",
          stroke: "#c2410c",
          value: function (u, v, s, i) {
            return v == null ? "" : v.toFixed(1) + " ms (rank " + data.rank[i] + ")";
          },
        },
      ],
    },
    [data.step, data.lag_ms],
    target
  );
})();

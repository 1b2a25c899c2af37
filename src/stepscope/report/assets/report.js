/* stepscope HTML report: renders the inline report JSON (schema stepscope.report v1).
 * Every text from a trace goes into the DOM as text (textContent), never as markup.
 * Charts: uPlot; flame graph: d3-flame-graph (both vendored, inline above this script). */
(function () {
  "use strict";

  const DATA = JSON.parse(document.getElementById("stepscope-data").textContent);
  const SUMMARIES = [DATA.combined].concat(DATA.files.length > 1 ? DATA.files : []);
  const HOST_COLORS = {
    data_loading: "#e6a700",
    forward: "#2e9d48",
    backward: "#2f6fd6",
    optimizer: "#a347c2",
    communication: "#d93f3f",
    other_annotated: "#17a2b8",
    other_operators: "#8bc34a",
    python: "#f2c94c",
    idle_other: "#b5b5b5",
  };
  const DEVICE_COLORS = {
    computation: "#2e9d48",
    communication: "#d93f3f",
    memory: "#e6a700",
    other: "#17a2b8",
    idle: "#b5b5b5",
  };
  const TEMPORAL_COLORS = { computation: "#2e9d48", non_compute: "#e6a700", idle: "#b5b5b5" };
  const KERNEL_COLORS = {
    COMPUTATION: "#2e9d48",
    COMMUNICATION: "#d93f3f",
    MEMORY: "#e6a700",
    OTHER: "#17a2b8",
  };
  const state = { view: 0, plots: [], flame: null, redrawFlame: null, flameIndex: 0 };

  // ---- small helpers -------------------------------------------------------------------
  function h(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "style") node.style.cssText = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value);
    }
    for (const child of children.flat()) {
      if (child === undefined || child === null || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  const nf = (digits) =>
    new Intl.NumberFormat("en-US", {
      minimumFractionDigits: digits,
      maximumFractionDigits: digits,
    });
  const NF3 = nf(3);
  const NF1 = nf(1);
  const NF0 = nf(0);
  const ms = (ns) => (ns === null || ns === undefined ? "–" : NF3.format(ns / 1e6));
  const us = (ns) => (ns === null || ns === undefined ? "–" : NF1.format(ns / 1e3));
  const pct = (p) => (p === null || p === undefined ? "–" : NF1.format(p) + " %");
  const stepLabel = (s) => (s.step === null ? "whole trace" : "#" + s.step);
  // a step of the combined view of several files: its rank or window first ("rank 1 #3")
  const sourceLabel = (source) => (DATA.source_labels || {})[source] || source;
  const fullStepLabel = (st) =>
    (DATA.files.length > 1 && state.view === 0 ? sourceLabel(st.source) + " " : "") + stepLabel(st);
  const prettyName = (name) => name.replace(/_/g, " ");
  function shortKernel(name) {
    let s = name;
    for (let i = 0; i < 20; i++) {
      const t = s.replace(/<[^<>]*>/g, "");
      if (t === s) break;
      s = t;
    }
    return s.replace(/\(.*\)$/, "").replace(/^void /, "");
  }
  function section(id, title, ...body) {
    return h("section", { id: id, class: "card" }, h("h2", {}, title), ...body);
  }
  function empty(text) {
    return h("p", { class: "empty" }, text);
  }
  function chartWidth(el) {
    return Math.max(320, Math.floor(el.getBoundingClientRect().width || 900));
  }

  // ---- stacked bar (plain DOM) ---------------------------------------------------------
  function stackBar(categories, colors, title) {
    const total = categories.reduce((a, c) => a + c.ns, 0);
    const bar = h("div", { class: "stackbar", role: "img", "aria-label": title });
    const legend = h("div", { class: "legend" });
    for (const c of categories) {
      if (!c.ns) continue;
      const share = total ? (100 * c.ns) / total : 0;
      const color = colors[c.name] || "#999";
      bar.append(
        h("span", {
          class: "seg",
          style: `width:${share}%;background:${color}`,
          title: `${prettyName(c.name)}: ${ms(c.ns)} ms (${NF1.format(share)} %)`,
        }),
      );
      legend.append(
        h(
          "span",
          { class: "key" },
          h("i", { style: `background:${color}` }),
          `${prettyName(c.name)} ${NF1.format(share)} %`,
        ),
      );
    }
    return h("div", { class: "breakdown" }, bar, legend);
  }

  // ---- sortable tables -----------------------------------------------------------------
  // columns: [{title, value: row => sortable value, text?: row => display, num?: bool}]
  function sortableTable(id, columns, rows, caption) {
    const table = h("table", { id: id, class: "sortable" });
    if (caption) table.append(h("caption", {}, caption));
    const headRow = h("tr");
    const tbody = h("tbody");
    let sortCol = -1;
    let sortDir = 1;
    function fill() {
      tbody.replaceChildren();
      const ordered = rows.slice();
      if (sortCol >= 0) {
        const col = columns[sortCol];
        ordered.sort((a, b) => {
          const x = col.value(a);
          const y = col.value(b);
          if (typeof x === "number" && typeof y === "number") return sortDir * (x - y);
          return sortDir * String(x).localeCompare(String(y));
        });
      }
      for (const row of ordered) {
        tbody.append(
          h(
            "tr",
            {},
            columns.map((col) => {
              const shown = col.text ? col.text(row) : col.value(row);
              const full = col.title_of ? col.title_of(row) : null;
              return h("td", { class: col.num ? "num" : "txt", title: full }, shown);
            }),
          ),
        );
      }
    }
    columns.forEach((col, index) => {
      const th = h(
        "th",
        {
          class: col.num ? "num" : "txt",
          "aria-sort": "none",
          tabindex: "0",
          title: "click to sort",
        },
        col.title,
      );
      const sortBy = () => {
        sortDir = sortCol === index ? -sortDir : col.num ? -1 : 1;
        sortCol = index;
        for (const other of headRow.children) other.setAttribute("aria-sort", "none");
        th.setAttribute("aria-sort", sortDir > 0 ? "ascending" : "descending");
        fill();
      };
      th.addEventListener("click", sortBy);
      th.addEventListener("keydown", (e) => {
        if (e.key === "Enter" || e.key === " ") {
          e.preventDefault();
          sortBy();
        }
      });
      headRow.append(th);
    });
    table.append(h("thead", {}, headRow), tbody);
    fill();
    return h("div", { class: "tablewrap" }, table);
  }

  // ---- uPlot charts --------------------------------------------------------------------
  function stepAxisValues(labels) {
    return (u, splits) =>
      splits.map((v) => (Number.isInteger(v) && labels[v - 1] !== undefined ? labels[v - 1] : ""));
  }
  function xScale(n) {
    return { time: false, range: () => [0.5, n + 0.5] };
  }
  function stepChart(target, s) {
    const n = s.steps.length;
    const xs = s.steps.map((_, i) => i + 1);
    const labels = s.steps.map(fullStepLabel);
    const durs = s.steps.map((st) => st.dur_ns / 1e6);
    const median = s.steps.map(() => s.step_stats.median_ns / 1e6);
    const opts = {
      width: chartWidth(target),
      height: 260,
      scales: { x: xScale(n), y: { range: (u, lo, hi) => [0, hi * 1.08 || 1] } },
      series: [
        {
          label: "step",
          value: (u, v) =>
            v === null ? "–" : labels[v - 1] || "",
        },
        {
          label: "step time (ms)",
          stroke: "#2f6fd6",
          fill: "rgba(47,111,214,0.35)",
          paths: uPlot.paths.bars({ size: [0.7, 60] }),
          points: { show: false },
          value: (u, v) => (v === null ? "–" : NF3.format(v)),
        },
        {
          label: "median (ms)",
          stroke: "#d93f3f",
          dash: [6, 4],
          width: 1.5,
          points: { show: false },
          value: (u, v) => (v === null ? "–" : NF3.format(v)),
        },
      ],
      axes: [
        { values: stepAxisValues(labels), space: 40, label: "step" },
        { label: "ms", size: 60 },
      ],
    };
    state.plots.push(new uPlot(opts, [xs, durs, median], target));
  }

  // stacked bars: cumulative series drawn from the top category down, legend shows each slice
  function stackedChart(target, labels, perStep, names, colors, yLabel) {
    const n = labels.length;
    const xs = labels.map((_, i) => i + 1);
    names = names.filter((name) => perStep.some((cats) => cats[name] > 0));
    const raw = names.map((name) => perStep.map((cats) => (cats[name] || 0) / 1e6));
    const cum = [];
    let running = xs.map(() => 0);
    for (const values of raw) {
      running = running.map((v, i) => v + values[i]);
      cum.push(running);
    }
    const series = [{ label: "step", value: (u, v) => (v === null ? "–" : labels[v - 1] || "") }];
    const data = [xs];
    for (let k = names.length - 1; k >= 0; k--) {
      const slice = raw[k];
      series.push({
        label: prettyName(names[k]),
        stroke: colors[names[k]] || "#999",
        fill: colors[names[k]] || "#999",
        width: 0,
        paths: uPlot.paths.bars({ size: [0.7, 60] }),
        points: { show: false },
        value: (u, v, si, di) => (di === null || di === undefined ? "–" : NF3.format(slice[di])),
      });
      data.push(cum[k]);
    }
    const opts = {
      width: chartWidth(target),
      height: 280,
      scales: { x: xScale(n), y: { range: (u, lo, hi) => [0, hi * 1.05 || 1] } },
      series: series,
      axes: [
        { values: stepAxisValues(labels), space: 40, label: "step" },
        { label: yLabel, size: 60 },
      ],
    };
    state.plots.push(new uPlot(opts, data, target));
  }

  // ---- sections ------------------------------------------------------------------------
  function summaryCards(s) {
    const st = s.step_stats;
    const cards = [
      [
        "steps",
        (s.has_steps ? NF0.format(st.count) : "1 (whole trace)") +
          ((s.cut_short || []).length ? ` (+${s.cut_short.length} cut short, not counted)` : ""),
      ],
      ["median step", ms(st.median_ns) + " ms"],
      ["p95 step", ms(st.p95_ns) + " ms"],
      ["min / max", ms(st.min_ns) + " / " + ms(st.max_ns) + " ms"],
    ];
    const all = s.devices.find((d) => d.device === "all") || s.devices[0];
    if (all) cards.push(["device idle", pct(all.idle_pct)]);
    cards.push(["recommendations", String(s.recommendations.length)]);
    const grid = h(
      "div",
      { class: "cards" },
      cards.map(([k, v]) => h("div", { class: "stat" }, h("div", { class: "k" }, k), h("div", { class: "v" }, v))),
    );
    const slow = st.slowest.length
      ? h(
          "p",
          {},
          "Slowest steps: ",
          st.slowest
            .map((x) => `${stepLabel(x)} ${ms(x.dur_ns)} ms` + (DATA.files.length > 1 ? ` (${sourceLabel(x.source)})` : ""))
            .join(", "),
        )
      : null;
    const files = s.files.length > 1 ? h("p", { class: "dim" }, "Files: ", s.files.join(", ")) : null;
    const notes = s.notes.length ? h("ul", { class: "notes" }, s.notes.map((n) => h("li", {}, n))) : null;
    return section("summary", "Summary", grid, slow, files, notes);
  }

  function recommendations(s) {
    if (!s.recommendations.length) {
      return section("recommendations", "Recommendations", empty("None of the rules fired."));
    }
    const list = s.recommendations.map((r) =>
      h(
        "div",
        { class: "rec " + r.severity },
        h("h3", {}, r.title),
        h("p", {}, r.advice),
        h(
          "dl",
          { class: "evidence" },
          Object.entries(r.evidence).flatMap(([k, v]) => [
            h("dt", {}, prettyName(k)),
            h("dd", {}, typeof v === "number" ? String(v) : JSON.stringify(v)),
          ]),
        ),
        h("p", { class: "dim" }, "rule: ", r.rule),
      ),
    );
    return section("recommendations", "Recommendations", list);
  }

  function stepsSection(s, after) {
    const chart = h("div", { id: "step-chart", class: "chart" });
    const host = h("div", { id: "host-chart", class: "chart" });
    const body = section(
      "steps",
      "Step times",
      h("p", { class: "dim" }, "Every analysed step; the dashed line is the median."),
      chart,
      h("h3", {}, "Where each step's host time went"),
      stackBar(s.host_total.categories, HOST_COLORS, "host breakdown of all steps"),
      host,
    );
    after.push(() => {
      stepChart(chart, s);
      const labels = s.host_steps.map((b, i) => (s.steps[i] ? fullStepLabel(s.steps[i]) : stepLabel(b)));
      const perStep = s.host_steps.map((b) => Object.fromEntries(b.categories.map((c) => [c.name, c.ns])));
      const names = Object.keys(HOST_COLORS);
      stackedChart(host, labels, perStep, names, HOST_COLORS, "ms");
    });
    return body;
  }

  function deviceSection(s, after) {
    if (!s.devices.length) {
      return section("device", "Device timeline", empty("No device (GPU) events in this trace."));
    }
    const parts = [];
    for (const d of s.devices) {
      parts.push(h("h3", {}, `Device ${d.device}`));
      parts.push(h("p", { class: "dim" }, `${d.scope}; ${NF0.format(d.events)} events over ${ms(d.span_ns)} ms`));
      parts.push(
        stackBar(
          [
            { name: "computation", ns: d.compute_ns },
            { name: "non_compute", ns: d.non_compute_ns },
            { name: "idle", ns: d.idle_ns },
          ],
          TEMPORAL_COLORS,
          `device ${d.device} temporal breakdown`,
        ),
      );
      parts.push(
        h(
          "p",
          {},
          `idle ${pct(d.idle_pct)} · compute ${pct(d.compute_pct)} · non-compute ${pct(d.non_compute_pct)} (HTA's temporal breakdown)`,
        ),
      );
      const kt = d.kernel_types.map((k) => ({ name: k.kernel_type, ns: k.ns }));
      if (kt.length) {
        parts.push(h("p", { class: "dim" }, "Kernel types (share of busy time):"));
        parts.push(stackBar(kt, KERNEL_COLORS, `device ${d.device} kernel types`));
      }
      if (d.streams.length) {
        parts.push(
          sortableTable(
            null,
            [
              { title: "stream", value: (r) => r.stream, num: true },
              { title: "events", value: (r) => r.events, text: (r) => NF0.format(r.events), num: true },
              { title: "busy ms", value: (r) => r.busy_ns, text: (r) => ms(r.busy_ns), num: true },
              { title: "idle ms", value: (r) => r.idle_ns, text: (r) => ms(r.idle_ns), num: true },
              { title: "compute ms", value: (r) => r.computation_ns, text: (r) => ms(r.computation_ns), num: true },
              { title: "comm ms", value: (r) => r.communication_ns, text: (r) => ms(r.communication_ns), num: true },
              { title: "memory ms", value: (r) => r.memory_ns, text: (r) => ms(r.memory_ns), num: true },
            ],
            d.streams,
            "Streams",
          ),
        );
      }
    }
    const keys = Object.keys(s.device_steps);
    if (keys.length) {
      const chart = h("div", { id: "device-chart", class: "chart" });
      parts.push(h("h3", {}, "Device time within each step"), chart);
      after.push(() => {
        const perStep = keys.map((k) => Object.fromEntries(s.device_steps[k].map((c) => [c.name, c.ns])));
        const labels = keys.map((k) => (/^\d+$/.test(k) ? "#" + k : k));
        stackedChart(chart, labels, perStep, Object.keys(DEVICE_COLORS), DEVICE_COLORS, "ms");
      });
    }
    if (s.launch_delay) {
      const ld = s.launch_delay;
      parts.push(
        h(
          "p",
          {},
          `CPU→device launch delay: ${NF0.format(ld.count)} launches, mean ${us(ld.mean_ns)} µs, median ${us(ld.median_ns)} µs, p95 ${us(ld.p95_ns)} µs, max ${us(ld.max_ns)} µs`,
        ),
      );
    }
    return section("device", "Device timeline", parts);
  }

  function topsSection(s) {
    const parts = [];
    if (s.operators.length) {
      parts.push(
        sortableTable(
          "table-operators",
          [
            { title: "operator / region", value: (r) => r.name },
            { title: "category", value: (r) => prettyName(r.category) },
            { title: "calls", value: (r) => r.calls, text: (r) => NF0.format(r.calls), num: true },
            { title: "self ms", value: (r) => r.self_ns, text: (r) => ms(r.self_ns), num: true },
            { title: "total ms", value: (r) => r.total_ns, text: (r) => ms(r.total_ns), num: true },
            { title: "self % of steps", value: (r) => r.self_pct, text: (r) => NF1.format(r.self_pct), num: true },
          ],
          s.operators,
          "Top operators and regions (by self time)",
        ),
      );
    }
    if (s.kernels.length) {
      parts.push(
        sortableTable(
          "table-kernels",
          [
            { title: "kernel", value: (r) => shortKernel(r.name), title_of: (r) => r.name },
            { title: "type", value: (r) => r.kernel_type.toLowerCase() },
            { title: "calls", value: (r) => r.calls, text: (r) => NF0.format(r.calls), num: true },
            { title: "total ms", value: (r) => r.total_ns, text: (r) => ms(r.total_ns), num: true },
            { title: "mean µs", value: (r) => r.mean_ns, text: (r) => us(r.mean_ns), num: true },
            { title: "max µs", value: (r) => r.max_ns, text: (r) => us(r.max_ns), num: true },
            { title: "launched by", value: (r) => r.launched_by.join(", ") },
          ],
          s.kernels,
          "Top device kernels, with the operators that launched them",
        ),
      );
    }
    if (s.functions.length) {
      parts.push(
        sortableTable(
          "table-functions",
          [
            { title: "Python function", value: (r) => r.name },
            {
              title: "calls",
              value: (r) => r.calls,
              text: (r) => (r.sampled ? "~" : "") + NF0.format(r.calls),
              num: true,
            },
            { title: "self ms", value: (r) => r.self_ns, text: (r) => ms(r.self_ns), num: true },
            { title: "total ms", value: (r) => r.total_ns, text: (r) => ms(r.total_ns), num: true },
          ],
          s.functions,
          "Top Python functions (~N: sampled, N samples)",
        ),
      );
    }
    if (!parts.length) parts.push(empty("No operators, kernels or Python functions in the analysed steps."));
    return section("tops", "Top tables", h("p", { class: "dim" }, "Click a column title to sort."), parts);
  }

  function flameSection(view, after) {
    const graphs = view.flames;
    if (!graphs.length) {
      const why = DATA.generator.flames_given
        ? "No stacks: the analysed steps hold no nested host spans or stack samples."
        : "No stacks: the report was analysed without its flame-graph stacks.";
      return section("flame", "Flame graph", empty(why));
    }
    const chart = h("div", { id: "flame-chart" });
    const details = h("div", { id: "flame-details", class: "dim" }, " ");
    const picker = h(
      "select",
      {
        id: "flame-kind",
        onchange: (e) => {
          state.flameIndex = Number(e.target.value);
          drawFlame(chart, details, graphs[state.flameIndex]);
        },
      },
      graphs.map((g, i) => h("option", { value: String(i) }, g.title)),
    );
    if (state.flameIndex >= graphs.length) state.flameIndex = 0;
    picker.value = String(state.flameIndex);
    const search = h("input", {
      id: "flame-search",
      type: "search",
      placeholder: "search frames",
      oninput: (e) => {
        if (!state.flame) return;
        if (e.target.value) state.flame.search(e.target.value);
        else state.flame.clear();
      },
    });
    const reset = h("button", { type: "button", onclick: () => state.flame && state.flame.resetZoom() }, "reset zoom");
    after.push(() => drawFlame(chart, details, graphs[state.flameIndex]));
    return section(
      "flame",
      "Flame graph",
      h("div", { class: "toolbar" }, picker, search, reset),
      h("p", { class: "dim" }, "Root at the bottom; width is time (or samples). Click a frame to zoom in, hover for its share."),
      chart,
      details,
    );
  }

  function drawFlame(target, details, graph) {
    for (const tip of document.querySelectorAll(".d3-flame-graph-tip")) tip.remove();
    target.replaceChildren();
    const total = graph.root.value || 1;
    const fmt = (v) => (graph.unit === "ns" ? ms(v) + " ms" : NF0.format(v) + " samples");
    const label = (d) => `${d.data.name}: ${fmt(d.value)} (${NF1.format((100 * d.value) / total)} %)`;
    const tip = flamegraph.tooltip.defaultFlamegraphTooltip().text(label);
    let searched = "";
    const showDetails = (text) => {
      details.textContent = text || searched || "\u00a0";
    };
    const chart = flamegraph
      .default()
      .width(chartWidth(target))
      .cellHeight(18)
      .minFrameSize(1)
      .transitionDuration(250)
      .sort(false)
      .selfValue(false)
      .tooltip(tip)
      .setLabelHandler(label)
      .setDetailsElement(details)
      .setDetailsHandler(showDetails)
      .setSearchHandler((results, sum, all) => {
        searched = results.length
          ? `search: ${results.length} frames, ${fmt(sum)} of ${fmt(all)} (${NF1.format((100 * sum) / (all || 1))} %)`
          : "";
        showDetails("");
      });
    d3.select(target).datum(graph.root).call(chart);
    state.flame = chart;
    state.redrawFlame = () => drawFlame(target, details, graph);
  }

  function extrasSection(s) {
    const parts = [];
    if (s.counters.length) {
      parts.push(
        sortableTable(
          "table-counters",
          [
            { title: "counter", value: (r) => r.name },
            { title: "series", value: (r) => r.series.join(", ") },
            { title: "events", value: (r) => r.events, num: true },
            { title: "min", value: (r) => r.min, num: true },
            { title: "max", value: (r) => r.max, num: true },
            { title: "last", value: (r) => r.last, num: true },
          ],
          s.counters,
          "Counters",
        ),
      );
    }
    const dropped = Object.entries(s.dropped);
    parts.push(
      h(
        "p",
        {},
        dropped.length
          ? "Dropped events: " + dropped.map(([k, v]) => `${k} ${NF0.format(v)}`).join(", ")
          : "No dropped events recorded.",
      ),
    );
    if (s.profiler_overhead_ns) parts.push(h("p", {}, `Profiler overhead spans: ${ms(s.profiler_overhead_ns)} ms`));
    parts.push(overheadText(s.overhead));
    return section("extras", "Overhead, counters and recorder health", parts);
  }

  function overheadText(o) {
    if (!o) return h("p", { id: "overhead" }, "Overhead: not stated (no step times: not written by stepscope).");
    const cold = o.cold_steps ? ` (and ${o.cold_steps} cold first steps left out)` : "";
    const counts = `${o.recorded_steps} recorded, ${o.unrecorded_steps} warm unrecorded${cold}, ${o.warmup_steps} warmup steps of this run`;
    const said = o.optimizers_in_turn > 1
      ? `Overhead: no trustworthy comparison in this run: ${o.optimizers_in_turn} optimizers end steps in turn, and the medians mix their different steps (${counts}).`
      : o.settled === false
      ? `Overhead: no trustworthy comparison in this run: the unrecorded steps before the window were still getting faster (${counts}); a schedule with more wait steps gives warm ones to compare with.`
      : o.slowdown_pct === null
      ? (o.recorded_steps && o.unrecorded_steps
        ? `Overhead: too few steps to compare recorded with unrecorded ones (${counts}; 3 warm ones each are needed: a schedule with wait=5 or more gives them).`
        : `Overhead: no ${o.recorded_median_ns === null ? "recorded" : "unrecorded"} step to compare with (${counts}).`)
      : `Overhead: recorded steps took ${o.slowdown_pct >= 0 ? "+" : ""}${o.slowdown_pct.toFixed(1)}% against unrecorded steps ` +
        `(median ${ms(o.recorded_median_ns)} vs ${ms(o.unrecorded_median_ns)} ms; ${counts}).`;
    const list = (m) => Object.entries(m || {}).map(([k, v]) => `${k} ${ms(v)} ms`).join(", ");
    const inside = list(o.in_steps_ns), hooks = list(o.collector_ns);
    const saving = o.edges_saving ? `; ${o.edges_saving} still being saved when this trace was written` : "";
    const edges = o.edges && o.edge_extra_ns !== null && o.edge_extra_ns !== undefined
      ? ` Window edges: ${ms(o.edge_extra_ns)} ms over ${o.edges} edges (the step before each window start and stop, the step that ended there and the steps after it until the window was saved, over the median step of their kinds: the profiler's stop and its save off the loop included${saving}).`
      : "";
    return h("p", { id: "overhead" }, said + edges + (inside ? ` Measured inside the recorded steps: ${inside}.` : "") + (hooks ? ` Collector hooks: ${hooks}.` : ""));
  }

  // ---- memory (profile_memory) -----------------------------------------------------------
  const mib = (b) => (b === null || b === undefined ? "–" : NF1.format(b / 1048576) + " MiB");

  function memoryChart(target, timeline) {
    const names = Object.keys(timeline);
    const times = [...new Set(names.flatMap((n) => timeline[n].map((p) => p[0])))].sort((a, b) => a - b);
    const t0 = times.length ? times[0] : 0;
    const index = new Map(times.map((t, i) => [t, i]));
    const data = [times.map((t) => (t - t0) / 1e6)];
    const colors = ["#2f6fd6", "#2e9d48", "#d93f3f", "#a347c2", "#e6a700", "#17a2b8"];
    const series = [{ label: "ms" }];
    names.forEach((name, k) => {
      const ys = times.map(() => null);
      for (const [t, b] of timeline[name]) ys[index.get(t)] = b / 1048576;
      data.push(ys);
      // the RSS is the whole process: on an axis of its own, so it does not flatten the others
      const scale = name === "rss" ? "rss" : "y";
      series.push({ label: name + " (MiB)", stroke: colors[k % colors.length], width: 1.5, spanGaps: true, scale: scale });
    });
    const axes = [{ label: "time (ms)" }, { label: "MiB", size: 60, scale: "y" }];
    if (names.includes("rss")) axes.push({ label: "RSS (MiB)", size: 60, scale: "rss", side: 1, grid: { show: false } });
    const opts = {
      width: chartWidth(target),
      height: 280,
      scales: { x: { time: false }, y: {}, rss: {} },
      series: series,
      axes: axes,
    };
    state.plots.push(new uPlot(opts, data, target));
  }

  function memorySection(s, after) {
    const m = s.memory;
    if (!m) return [];  // spread into the page: nothing, never the text "null"
    const parts = [];
    for (const leak of m.leaks) {
      const what = leak.kind === "python" ? "Python heap" : leak.kind + " tensors";
      parts.push(
        h("p", { class: "leak" }, `Possible leak: ${what} held at step ends rose by about ${mib(leak.per_step_bytes)} per step over ${leak.steps} steps`),
      );
      for (const site of leak.sites) parts.push(h("p", { class: "dim" }, `grew ${mib(site.growth_bytes)}: ${site.function}` + (site.file ? ` (${site.file}:${site.line})` : "")));
    }
    if (!m.leaks.length && m.steps.length && m.leak_judged) parts.push(h("p", { class: "dim" }, "No steady rise of memory held at step ends (no leak hint)."));
    if (Object.keys(m.timeline).length) {
      const chart = h("div", { id: "memory-chart" });
      parts.push(chart);
      after.push(() => memoryChart(chart, m.timeline));
    }
    const devices = [...new Set(m.steps.flatMap((r) => Object.keys(r.tensor_peak)))].sort();
    const columns = [
      { title: "step", value: (r) => r.step, num: true },
      { title: "python held (MiB)", value: (r) => (r.python_current === null ? null : r.python_current / 1048576), num: true },
      { title: "python peak (MiB)", value: (r) => (r.python_peak === null ? null : r.python_peak / 1048576), num: true },
    ];
    for (const d of devices) {
      columns.push({ title: d + " held (MiB)", value: (r) => (r.tensor_current[d] || 0) / 1048576, num: true });
      columns.push({ title: d + " peak (MiB)", value: (r) => (r.tensor_peak[d] || 0) / 1048576, num: true });
    }
    if (m.steps.some((r) => r.cuda_allocator && Object.keys(r.cuda_allocator).length)) {
      for (const key of ["allocated", "reserved"]) {
        const of = (r) => (r.cuda_allocator && key in r.cuda_allocator ? r.cuda_allocator[key] / 1048576 : null);
        columns.push({ title: `cuda ${key} (MiB)`, value: of, num: true });
      }
    }
    columns.push({ title: "rss (MiB)", value: (r) => (r.rss === null ? null : r.rss / 1048576), num: true });
    for (const c of columns.slice(1)) c.text = (r) => (c.value(r) === null ? "–" : NF3.format(c.value(r)));
    parts.push(sortableTable("table-memory-steps", columns, m.steps, "Memory per step"));
    if (m.peak_table.length) {
      const what = m.peak_kind === "python" ? "Python heap" : m.peak_kind + " tensors";
      parts.push(
        sortableTable(
          "table-memory-peak",
          [
            { title: "allocated by", value: (r) => r.function },
            { title: "where", value: (r) => (r.file ? r.file + ":" + r.line : "") },
            { title: "MiB", value: (r) => r.bytes / 1048576, text: (r) => NF3.format(r.bytes / 1048576), num: true },
            { title: "blocks", value: (r) => r.count, num: true },
          ],
          m.peak_table,
          `Alive at the peak: ${what}, ${mib(m.peak_bytes)} in step ${m.peak_step}`,
        ),
      );
    }
    for (const note of m.notes) parts.push(h("p", { class: "dim" }, note));
    return [section("memory", "Memory", parts)];
  }

  // ---- DataLoader workers ------------------------------------------------------------------
  function dataWorkersSection(s) {
    const dw = s.data_workers;
    if (!dw || !dw.loaders.length) return [];  // spread into the page: nothing, never "null"
    const parts = [];
    const keys = ["num_workers", "prefetch_factor", "pin_memory", "persistent_workers", "start_method"];
    dw.loaders.forEach((x, n) => {
      const settings = keys.filter((k) => k in x.settings).map((k) => `${k}=${x.settings[k]}`);
      parts.push(h("h3", {}, `DataLoader ${x.loader} (${x.settings.dataset || "?"}; ${settings.join(", ")})`));
      const counts = [[x.ahead, "ahead"], [x.just_in_time, "just in time"], [x.late, "late"],
        [x.in_loop, "made in the loop"], [x.unknown, "made before recording"]].filter((c) => c[0]);
      parts.push(h("p", {}, `Batches taken by ${x.steps.length} steps: ` +
        (counts.map((c) => `${c[0]} ${c[1]}`).join(", ") || "none") + `; the loop waited ${ms(x.wait_ns)} ms` +
        (x.ready_ahead_median === null ? "" : `; batches ready when a step asked: median ${x.ready_ahead_median}`)));
      if (x.workers.length) {
        parts.push(sortableTable(`table-workers-${n}`, [
          { title: "worker", value: (r) => r.worker, num: true },
          { title: "pids", value: (r) => r.pids.join(", ") + (r.exited ? " (exited)" : "") },
          { title: "batches", value: (r) => r.batches, num: true },
          { title: "busy", value: (r) => r.busy_pct, text: (r) => pct(r.busy_pct), num: true },
          { title: "dataset ms", value: (r) => r.dataset_ns, text: (r) => ms(r.dataset_ns), num: true },
          { title: "collate ms", value: (r) => r.collate_ns, text: (r) => ms(r.collate_ns), num: true },
        ], x.workers, "Workers"));
      }
      const timed = (title, key) => ({ title: title, value: (r) => r[key], text: (r) => ms(r[key]), num: true });
      parts.push(sortableTable(`table-worker-steps-${n}`, [
        { title: "step", value: (r) => r.step, num: true },
        { title: "batch", value: (r) => r.batch, text: (r) => (r.epoch ? `${r.epoch}:${r.batch}` : String(r.batch)), num: true },
        { title: "worker", value: (r) => r.worker, text: (r) => (r.worker < 0 ? "loop" : String(r.worker)), num: true },
        { title: "ready", value: (r) => prettyName(r.status) },
        timed("margin ms", "margin_ns"), timed("wait ms", "wait_ns"), timed("dataset ms", "dataset_ns"),
        timed("dataset cpu ms", "dataset_cpu_ns"), timed("collate ms", "collate_ns"), timed("pin ms", "pin_ns"),
        timed("transfer ms", "transfer_ns"),
        { title: "waiting", value: (r) => r.ready_ahead, text: (r) => (r.ready_ahead === null ? "–" : String(r.ready_ahead)), num: true },
      ], x.steps, "Batch per step"));
      if (x.functions.length) {
        parts.push(sortableTable(`table-worker-functions-${n}`, [
          { title: "function", value: (r) => r.name },
          { title: "self samples", value: (r) => r.self_samples, num: true },
          { title: "self", value: (r) => r.self_pct, text: (r) => pct(r.self_pct), num: true },
          { title: "total samples", value: (r) => r.total_samples, num: true },
        ], x.functions, `Slowest dataset functions (${x.dataset_samples} worker samples)`));
      }
      for (const note of x.notes) parts.push(h("p", { class: "dim" }, note));
    });
    return [section("data-workers", "DataLoader workers", parts)];
  }

  // ---- across ranks: stragglers, per-rank table, ranks x steps heat map --------------------
  function ranksSection() {
    const r = DATA.ranks;
    if (!r || state.view !== 0) return [];
    const parts = [];
    if (r.stragglers.length) {
      const s = r.stragglers[0];
      parts.push(
        h(
          "p",
          { id: "straggler", class: "straggler" },
          `Straggler: rank ${s.rank} — the others waited ${ms(s.late_ns)} ms for it` +
            (s.step === null
              ? "."
              : `; busy ${ms(s.excess_per_step_ns)} ms per step longer than the other ranks; ` +
                `${prettyName(s.phase)} ${ms(s.phase_ns)} ms per step vs ` +
                `${ms(s.others_median_ns)} ms on the other ranks (medians over steps), most in step ${s.step}.`),
        ),
      );
    } else parts.push(empty("No straggler: no rank kept the others waiting."));
    const share = (row, key) => (row.total_ns ? (100 * row[key]) / row.total_ns : 0);
    parts.push(
      sortableTable(
        "ranks-table",
        [
          { title: "rank", value: (x) => x.rank, num: true },
          { title: "median step ms", value: (x) => x.step_median_ns, text: (x) => ms(x.step_median_ns), num: true },
          { title: "computation", value: (x) => share(x, "computation_ns"), text: (x) => pct(share(x, "computation_ns")), num: true },
          { title: "communication", value: (x) => share(x, "communication_ns"), text: (x) => pct(share(x, "communication_ns")), num: true },
          { title: "idle", value: (x) => share(x, "idle_ns"), text: (x) => pct(share(x, "idle_ns")), num: true },
          { title: "waiting at collectives ms", value: (x) => x.collective_wait_ns, text: (x) => ms(x.collective_wait_ns), num: true },
          { title: "others waiting ms", value: (x) => x.late_ns, text: (x) => ms(x.late_ns), num: true },
        ],
        r.ranks,
        "Per rank (host time over the analysed steps)",
      ),
    );
    const map = DATA.heatmap;
    let top = 0;
    for (const row of map.busy_ms) for (const v of row) top = Math.max(top, v);
    const grid = h("table", { id: "rank-heatmap", class: "heatmap" });
    grid.append(h("caption", {}, "Busy time (step time minus waiting at collectives), ms: ranks × steps"));
    grid.append(h("tr", {}, h("th", {}, "rank \\ step"), map.steps.map((st) => h("th", {}, String(st)))));
    map.ranks.forEach((rank, i) => {
      const cells = map.busy_ms[i].map((v, j) => {
        const level = top ? v / top : 0;
        return h(
          "td",
          {
            class: "cell",
            "data-rank": String(rank),
            "data-step": String(map.steps[j]),
            style: `background:rgba(217,63,63,${(0.08 + 0.92 * level).toFixed(3)})`,
            title: `rank ${rank}, step ${map.steps[j]}: busy ${NF3.format(v)} ms, step ${NF3.format(map.step_ms[i][j])} ms`,
          },
          NF1.format(v),
        );
      });
      grid.append(h("tr", {}, h("th", {}, `rank ${rank}`), cells));
    });
    parts.push(grid);
    return [section("ranks", "Across ranks", parts)];
  }

  // ---- page ----------------------------------------------------------------------------
  function render() {
    for (const p of state.plots) p.destroy();
    state.plots = [];
    state.flame = state.redrawFlame = null;
    const s = SUMMARIES[state.view];
    const view = DATA.views[state.view];
    const after = [];
    const app = document.getElementById("app");
    app.replaceChildren(
      summaryCards(s),
      ...ranksSection(),
      recommendations(s),
      stepsSection(s, after),
      deviceSection(s, after),
      topsSection(s),
      flameSection(view, after),
      ...memorySection(s, after),
      ...dataWorkersSection(s),
      extrasSection(s),
      h(
        "footer",
        { class: "dim" },
        `${DATA.generator.name} ${DATA.generator.version} · ${DATA.generator.created} · schema ${DATA.schema} v${DATA.schema_version}` +
          (DATA.step_range ? ` · steps ${DATA.step_range[0]}-${DATA.step_range[1]}` : ""),
      ),
    );
    for (const fn of after) fn();
  }

  function renderViews() {
    const nav = document.getElementById("views");
    nav.replaceChildren();
    if (DATA.views.length < 2) return;
    DATA.views.forEach((v, i) => {
      nav.append(
        h(
          "button",
          {
            type: "button",
            class: i === state.view ? "active" : "",
            onclick: () => {
              state.view = i;
              renderViews();
              render();
            },
          },
          v.title,
        ),
      );
    });
  }

  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => {
      for (const p of state.plots) p.setSize({ width: chartWidth(p.root.parentNode), height: p.height });
      if (state.redrawFlame) state.redrawFlame();
    }, 200);
  });
  renderViews();
  render();
  document.body.setAttribute("data-rendered", "true");
})();

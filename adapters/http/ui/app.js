// tlgw operator page (SPEC R17.1). Plain DOM, no dependencies, no build step.
//
// Every value shown comes from the admin API, and much of it (worker ids, model names, lane
// names, reasons) from engines or clients: it is only ever set as text (el() below appends text
// nodes), never parsed as HTML. The admin key lives in this tab only (a variable mirrored in
// sessionStorage) and goes out only as an Authorization header on same-origin fetches.
"use strict";

(() => {
  const POLL_MS = 1000; // the page refreshes at least every second
  const TIMEOUT_MS = 4000; // one round of fetches gives up after this
  const KEY_STORE = "tlgw.adminKey";

  const SOURCES = [
    { name: "workers", path: "/admin/v1/workers", render: renderWorkers },
    { name: "queue", path: "/admin/v1/queue", render: renderQueue },
    { name: "routes", path: "/admin/v1/routes", render: renderRoutes },
    { name: "programs", path: "/admin/v1/programs", render: renderPrograms },
    { name: "rollouts", path: "/admin/v1/rollouts", render: renderRollouts },
    { name: "replicas", path: "/admin/v1/replicas", render: renderReplicas },
    { name: "history", path: "/admin/v1/history?scope=routes", render: renderHistory },
  ];

  let key = readKey();
  let timer = 0;
  let running = false;
  let again = false;
  let lastGood = null; // Date of the last round where every source answered
  const latest = {}; // the last answer of each source, for the summary tiles

  // ---- DOM helpers: text only ----

  // el builds an element. props may set class, title, colSpan and data (a dataset object);
  // children are nodes or values, values become text nodes.
  function el(tag, props, ...children) {
    const e = document.createElement(tag);
    if (props) {
      if (props.class) e.className = props.class;
      if (props.title != null) e.title = String(props.title);
      if (props.colSpan) e.colSpan = props.colSpan;
      if (props.data) for (const [k, v] of Object.entries(props.data)) e.dataset[k] = String(v);
    }
    for (const c of children.flat()) {
      if (c == null || c === false) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  const $ = (sel) => document.querySelector(sel);

  function badge(text, kind) {
    return el("span", { class: "badge " + kind }, text);
  }

  function muted(text) {
    return el("span", { class: "muted" }, text);
  }

  // bar is a horizontal meter: frac in [0,1], coloured by level. Its width is set through
  // the CSSOM, which the page's Content-Security-Policy allows (no inline style attribute).
  function bar(frac, label, title) {
    const f = Math.max(0, Math.min(1, Number.isFinite(frac) ? frac : 0));
    const fill = el("span", { class: "fill " + (f >= 0.9 ? "bad" : f >= 0.7 ? "warn" : "ok") });
    fill.style.width = (f * 100).toFixed(1) + "%";
    return el("span", { class: "meter", title }, el("span", { class: "track" }, fill), el("span", { class: "label" }, label));
  }

  function setMeta(section, text) {
    $(section + " h2 .meta").textContent = text;
  }

  // ---- formatting ----

  const pad = (n) => String(n).padStart(2, "0");

  function clock(d) {
    return pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }

  function parseTime(s) {
    if (!s) return null;
    const d = new Date(s);
    return Number.isNaN(d.getTime()) || d.getFullYear() < 2 ? null : d;
  }

  // span formats a number of seconds for people: 0.4 s, 12 s, 3 m 05 s, 2 h 10 m.
  function span(sec) {
    const a = Math.abs(sec);
    if (a < 10) return sec.toFixed(1) + " s";
    if (a < 60) return Math.round(sec) + " s";
    const m = Math.floor(a / 60);
    if (m < 60) return (sec < 0 ? "-" : "") + m + " m " + pad(Math.floor(a % 60)) + " s";
    return (sec < 0 ? "-" : "") + Math.floor(m / 60) + " h " + pad(m % 60) + " m";
  }

  // goDuration parses Go's time.Duration.String() ("1m2.5s", "350ms") into seconds.
  function goDuration(s) {
    if (typeof s !== "string") return NaN;
    const unit = { h: 3600, m: 60, s: 1, ms: 1e-3, us: 1e-6, "µs": 1e-6, "μs": 1e-6, ns: 1e-9 };
    const re = /([0-9.]+)(h|ms|m|s|us|µs|μs|ns)/g;
    let total = 0;
    let seen = 0;
    let m;
    while ((m = re.exec(s)) !== null) {
      total += parseFloat(m[1]) * unit[m[2]];
      seen += m[0].length;
    }
    const body = s.replace(/^-/, "");
    if (body === "0s") return 0;
    return seen === body.length && seen > 0 ? (s.startsWith("-") ? -total : total) : NaN;
  }

  function waited(s) {
    const sec = goDuration(s);
    return Number.isFinite(sec) ? span(sec) : String(s ?? "");
  }

  function relative(d) {
    const sec = (d.getTime() - Date.now()) / 1000;
    return sec >= 0 ? "in " + span(sec) : span(-sec) + " ago";
  }

  function list(xs) {
    return Array.isArray(xs) && xs.length ? xs.join(", ") : null;
  }

  function table(headers, rows, empty) {
    const head = el("tr", null, headers.map((h) => el("th", h.num ? { class: "num" } : null, h.text ?? h)));
    const body = el("tbody");
    if (rows.length === 0) {
      body.append(el("tr", { class: "empty" }, el("td", { colSpan: headers.length }, empty)));
    } else {
      body.append(...rows);
    }
    return el("div", { class: "scroll" }, el("table", null, el("thead", null, head), body));
  }

  const num = (v) => el("td", { class: "num" }, v ?? 0);

  // ---- workers ----

  function workerState(w) {
    const until = parseTime(w.ejected_until);
    if (until && until.getTime() > Date.now()) return ["ejected", "bad"];
    if (w.scrape_error) return ["scrape error", "bad"];
    if (w.drained) return ["drained", "warn"];
    if (w.draining) return ["draining", "warn"];
    if (w.routable) return ["routable", "ok"];
    return ["not routable", "bad"];
  }

  function renderWorkers(data) {
    const ws = (data.workers || []).slice().sort((a, b) => String(a.id).localeCompare(String(b.id)));
    const rows = ws.map((w) => {
      const [state, kind] = workerState(w);
      const total = Number(w.kv_total_blocks) || 0;
      const free = Number(w.kv_free_blocks) || 0;
      const used = Math.max(0, total - free);
      const kv = total > 0
        ? bar(used / total, used + " / " + total + " (" + Math.round((100 * used) / total) + "%)",
          "KV blocks in use / total" + (w.block_size ? ", " + w.block_size + " tokens per block" : ""))
        : muted("unknown");
      const hb = parseTime(w.last_heartbeat);
      const until = parseTime(w.ejected_until);
      const ejection = until
        ? el("span", { title: "ejected until " + until.toISOString() },
          badge(w.ejection_reason || "ejected", "bad"), " until " + clock(until) + " (" + relative(until) + ")")
        : muted("—");
      const addr = w.addresses && w.addresses.http;
      return el("tr", { class: "state-" + kind, data: { id: w.id } },
        el("td", { class: "id" }, el("div", null, w.id), addr ? el("div", { class: "addr" }, addr) : null,
          w.static ? badge("static", "muted") : null,
          w.scrape_error ? el("div", { class: "err" }, w.scrape_error) : null),
        el("td", null, w.model),
        el("td", null, w.role),
        el("td", null, badge(state, kind)),
        num((Number(w.in_flight) || 0) + (Number(w.queue_depth) || 0)),
        num(w.in_flight),
        num(w.running),
        num(w.queue_depth),
        el("td", { class: "kv" }, kv),
        el("td", { title: hb ? hb.toISOString() : "" }, hb ? relative(hb) : muted("—")),
        el("td", null, ejection));
    });
    if (rows.length === 0) {
      rows.push(el("tr", { class: "empty" }, el("td", { colSpan: 11 }, "No workers: none has heartbeated yet, or every one was evicted.")));
    }
    $("#workers tbody").replaceChildren(...rows);
    const routable = ws.filter((w) => w.routable).length;
    setMeta("#workers", ws.length + " listed · " + routable + " routable · epoch " + data.epoch);
  }

  // ---- queue ----

  function headState(h) {
    if (!h) return badge("—", "muted");
    const kind = h.state === "held" ? "warn" : h.state === "capacity" ? "info" : "ok";
    return badge(h.state, kind);
  }

  function renderQueue(data) {
    const body = $("#queue .body");
    if (!data.enabled) {
      body.replaceChildren(el("p", { class: "muted" }, "Admission is off: every request is dispatched at once."));
      setMeta("#queue", "off");
      return;
    }
    let queued = 0;
    const cards = (data.classes || []).map((c) => {
      queued += Number(c.queued) || 0;
      const limit = Number(c.queue_limit) || 0;
      const lanes = (c.lanes || []).map((l) => {
        const h = l.head;
        const until = h ? parseTime(h.until) : null;
        return el("tr", { class: "lane", data: { kind: l.kind, state: h ? h.state : "" } },
          el("td", null, l.kind),
          el("td", null, l.name || muted("—")),
          num(l.length),
          el("td", { class: "id" }, h ? h.request_id : muted("—")),
          el("td", null, h && h.tag ? h.tag : muted("—")),
          el("td", null, headState(h)),
          el("td", null, h && h.reason ? h.reason : muted("—")),
          el("td", null, h ? waited(h.waiting) : ""),
          el("td", { title: until ? until.toISOString() : "" }, until ? clock(until) + " (" + relative(until) + ")" : muted("—")));
      });
      const fill = limit > 0 ? bar(c.queued / limit, c.queued + " / " + limit, "queued / queue_limit")
        : el("span", { class: "muted" }, c.queued + " queued (queue_limit 0: never queues)");
      return el("div", { class: "qclass", data: { name: c.name } },
        el("h3", null, el("span", { class: "cname" }, c.name), fill,
          el("span", { class: "muted small" },
            "quantum " + c.quantum + " · deficit " + c.deficit + " · max wait " + c.max_wait)),
        table(["Lane", "Name", { text: "Length", num: true }, "Head request", "Tag", "State", "Reason", "Waiting", "Held until"],
          lanes, "No request waiting."));
    });
    body.replaceChildren(...(cards.length ? cards : [el("p", { class: "muted" }, "No admission classes.")]));
    setMeta("#queue", queued + " queued in " + cards.length + (cards.length === 1 ? " class" : " classes"));
  }

  // ---- routes ----

  function renderRoutes(data) {
    const rows = (data.routes || []).map((r) => {
      const backends = (r.backends || []).map((b) => b.model + " ×" + b.weight).join(", ");
      const cascade = (r.cascade || []).map((s) => s.model + (s.accept_if ? " if " + s.accept_if : "")).join(" → ");
      return el("tr", { data: { model: r.model } },
        el("td", { class: "id" }, r.model),
        el("td", null, list(r.aliases) || muted("—")),
        el("td", null, backends || cascade || muted("—"), cascade && backends ? " · " + cascade : null),
        el("td", null, list(r.targets) || muted("any")));
    });
    $("#routes .body").replaceChildren(table(["Model", "Aliases", "Backends / cascade", "Targets"], rows,
      "No routes: requests name worker models directly."));
    setMeta("#routes", rows.length + " · epoch " + data.epoch);
  }

  // ---- programs ----

  function renderPrograms(data) {
    const ps = data.programs || [];
    const rows = ps.map((p) => {
      const since = parseTime(p.paused_since);
      const kind = p.state === "paused" ? "warn" : p.state === "acting" ? "info" : "ok";
      return el("tr", null,
        el("td", { class: "id" }, p.session),
        el("td", null, badge(p.state, kind)),
        el("td", null, p.worker || muted("—")),
        num(p.tokens),
        el("td", null, since ? clock(since) + " (" + relative(since) + ")" : muted("—")));
    });
    let empty = "No programs.";
    if (!data.classifier) empty = "No admission classifier.";
    else if (!data.tracks_programs) empty = "The " + data.classifier + " classifier keeps no programs.";
    $("#programs .body").replaceChildren(table(["Session", "State", "Worker", { text: "Tokens", num: true }, "Paused since"], rows, empty));
    setMeta("#programs", (data.classifier || "no classifier") + " · " + ps.length);
  }

  // ---- rollouts (R25) ----

  function renderRollouts(data) {
    const rs = data.rollouts || [];
    const kinds = { running: "info", paused: "warn", completed: "ok", rolled_back: "bad", aborted: "warn" };
    const rows = rs.map((r) => {
      const h = r.history || [];
      const last = h.length ? h[h.length - 1] : null;
      const at = last ? parseTime(last.at) : null;
      const steps = r.steps || [];
      return el("tr", { data: { route: r.route } },
        el("td", { class: "id" }, r.route),
        el("td", null, r.baseline + " → " + r.canary),
        num(r.percent + "%"),
        el("td", null, r.status === "running" || r.status === "paused" ? (r.step + 1) + " / " + steps.length : muted("—")),
        el("td", null, badge(r.status, kinds[r.status] || "")),
        el("td", { class: "last" }, last ? last.decision + (last.reason ? " · " + last.reason : "") + (at ? " (" + relative(at) + ")" : "") : muted("none yet")));
    });
    $("#rollouts .body").replaceChildren(table(["Route", "Baseline → canary", { text: "Canary", num: true }, "Step", "Status", "Last decision"], rows,
      "No rollouts: a route's rollout = { canary, baseline, … } starts one."));
    setMeta("#rollouts", data.decider ? rs.length + " · decided by " + data.decider : rs.length);
  }

  // ---- replicas ----

  function renderReplicas(data) {
    const rs = data.replicas || [];
    const rows = rs.map((r) => {
      const started = parseTime(r.started_at);
      return el("tr", { class: r.self ? "self" : "" },
        el("td", { class: "id" }, el("div", null, r.id), r.self ? badge("this one", "info") : null),
        el("td", null, r.http_address || muted("—")),
        el("td", null, r.grpc_address || muted("—")),
        el("td", { title: started ? started.toISOString() : "" }, started ? relative(started) : muted("—")));
    });
    $("#replicas .body").replaceChildren(
      data.cluster
        ? el("p", null, "Cluster · config store ", badge(data.config_store_up ? "up" : "down", data.config_store_up ? "ok" : "bad"))
        : el("p", { class: "muted" }, "Single process (no [cluster]): routes and workers are kept in memory."),
      table(["Replica", "HTTP", "Registry", "Started"], rows, "No replica listed."));
    setMeta("#replicas", String(rs.length));
  }

  // ---- history (R24): charts of the last 15 minutes, drawn as SVG through the DOM ----

  const SVG = "http://www.w3.org/2000/svg";
  const CHART_W = 300, CHART_H = 72, PAD = 2;

  function svg(tag, attrs) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    return e;
  }

  // chart draws lines (each { label, cls, values: [number|null] }) on one scale from 0 to the
  // highest value; a null breaks a line. Its title and legend are text; its data attributes
  // say how many points each line has, for tests.
  function chart(title, unit, lines) {
    const n = Math.max(0, ...lines.map((l) => l.values.length));
    let top = 0;
    for (const l of lines) for (const v of l.values) if (v != null && v > top) top = v;
    const scale = top > 0 ? top : 1;
    const g = svg("svg", { viewBox: "0 0 " + CHART_W + " " + CHART_H, class: "chart", role: "img" });
    g.append(svg("line", { x1: 0, y1: CHART_H - PAD, x2: CHART_W, y2: CHART_H - PAD, class: "axis" }));
    const drawn = {};
    for (const l of lines) {
      let seg = [];
      let points = 0;
      const flush = () => {
        if (seg.length > 1) g.append(svg("polyline", { points: seg.join(" "), class: "line " + l.cls }));
        else if (seg.length === 1) {
          const [x, y] = seg[0].split(",");
          g.append(svg("circle", { cx: x, cy: y, r: 1.5, class: "dot " + l.cls }));
        }
        seg = [];
      };
      l.values.forEach((v, i) => {
        if (v == null) return flush();
        const x = n > 1 ? (i * CHART_W) / (n - 1) : CHART_W / 2;
        const y = CHART_H - PAD - (v / scale) * (CHART_H - 2 * PAD);
        seg.push(x.toFixed(1) + "," + y.toFixed(1));
        points++;
      });
      flush();
      drawn[l.cls] = points;
    }
    const last = (l) => { for (let i = l.values.length - 1; i >= 0; i--) if (l.values[i] != null) return l.values[i]; return null; };
    const legend = lines.map((l) => el("span", { class: "legend " + l.cls },
      l.label + " " + (last(l) == null ? "—" : fmtNum(last(l)) + unit)));
    return el("figure", { class: "chartbox", data: { points: JSON.stringify(drawn) } },
      el("figcaption", null, title, " ", muted("max " + fmtNum(top) + unit)), g, el("div", { class: "legends" }, legend));
  }

  function fmtNum(v) {
    return v >= 100 ? Math.round(v).toString() : v >= 10 ? v.toFixed(1) : v.toFixed(2);
  }

  function renderHistory(data) {
    const byRoute = new Map(); // route → metric → values
    let queue = null;
    for (const s of data.series || []) {
      if (s.metric === "queue_depth") queue = s.values;
      if (!s.route) continue;
      if (!byRoute.has(s.route)) byRoute.set(s.route, {});
      byRoute.get(s.route)[s.metric] = s.values;
    }
    const empty = (vs) => !vs || vs.every((v) => v == null);
    const charts = [];
    for (const [route, m] of [...byRoute].sort((a, b) => (a[0] < b[0] ? -1 : 1))) {
      charts.push(el("div", { class: "chartrow", data: { route } },
        chart(route + " · requests/s", "/s", [
          { label: "requests", cls: "req", values: m.requests_per_s || [] },
          { label: "errors", cls: "err", values: m.errors_per_s || [] }]),
        empty(m.ttft_p50_ms) && empty(m.ttft_p99_ms) ? null : chart(route + " · time to first byte", " ms", [
          { label: "p50", cls: "p50", values: m.ttft_p50_ms || [] },
          { label: "p99", cls: "p99", values: m.ttft_p99_ms || [] }]),
        empty(m.in_flight) ? null : chart(route + " · in flight", "", [
          { label: "in flight", cls: "inflight", values: m.in_flight }])));
    }
    if (queue && !empty(queue)) charts.push(el("div", { class: "chartrow" }, chart("admission queue", "", [{ label: "depth", cls: "queue", values: queue }])));
    $("#history .body").replaceChildren(...(charts.length ? charts : [el("p", { class: "muted" },
      data.points < 2 ? "Collecting: a sample every " + data.resolution_s + " s." : "No traffic in the last 15 minutes.")]));
    setMeta("#history", data.points + " samples · every " + data.resolution_s + " s");
  }

  // ---- summary ----

  function tile(label, value, kind) {
    return el("div", { class: "tile " + (kind || "") }, el("div", { class: "value" }, value), el("div", { class: "label" }, label));
  }

  function renderSummary() {
    const tiles = [];
    const w = latest.workers;
    if (w) {
      const ws = w.workers || [];
      const routable = ws.filter((x) => x.routable).length;
      const ejected = ws.filter((x) => { const u = parseTime(x.ejected_until); return u && u.getTime() > Date.now(); }).length;
      const inflight = ws.reduce((s, x) => s + (Number(x.in_flight) || 0), 0);
      tiles.push(tile("routable workers", routable + " / " + ws.length, routable === 0 ? "bad" : routable < ws.length ? "warn" : "ok"));
      tiles.push(tile("ejected", ejected, ejected ? "bad" : ""));
      tiles.push(tile("in flight", inflight));
    }
    const q = latest.queue;
    if (q) {
      const queued = (q.classes || []).reduce((s, c) => s + (Number(c.queued) || 0), 0);
      tiles.push(tile("queued", q.enabled ? queued : "off", queued ? "warn" : ""));
    }
    if (latest.routes) tiles.push(tile("routes", (latest.routes.routes || []).length));
    if (latest.programs) tiles.push(tile("programs", (latest.programs.programs || []).length));
    if (latest.replicas) tiles.push(tile("replicas", (latest.replicas.replicas || []).length));
    $("#summary").replaceChildren(...tiles);
  }

  // ---- fetching ----

  class APIError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function fetchJSON(path, signal) {
    const headers = { Accept: "application/json" };
    if (key) headers.Authorization = "Bearer " + key;
    let resp;
    try {
      resp = await fetch(path, { headers, signal, cache: "no-store", credentials: "omit", redirect: "error" });
    } catch (e) {
      throw new APIError(0, signal.aborted ? "timeout" : "network", signal.aborted ? "no answer within " + TIMEOUT_MS / 1000 + " s" : "gateway unreachable");
    }
    let body = null;
    try {
      body = await resp.json();
    } catch (e) {
      body = null;
    }
    if (!resp.ok) {
      const err = body && body.error ? body.error : {};
      throw new APIError(resp.status, err.code || "http_" + resp.status, err.message || "HTTP " + resp.status);
    }
    if (body === null || typeof body !== "object") throw new APIError(resp.status, "bad_json", "not a JSON object");
    return body;
  }

  function authProblem(errs) {
    return errs.find((e) => e.status === 401 || e.status === 403) || null;
  }

  function showAuth(err) {
    const hint = $("#keyhint");
    if (!err) {
      hint.hidden = true;
      document.body.dataset.auth = key ? "key" : "open";
      return;
    }
    let text;
    if (err.code === "forbidden_origin") {
      text = "This gateway has no API keys, so its admin API answers only on a loopback address (open this page on 127.0.0.1 or localhost). " + err.message;
    } else if (err.code === "insufficient_scope") {
      text = "This key lacks the admin scope. Enter an admin key.";
    } else if (key) {
      text = "The gateway refused this key (" + err.message + "). Enter an admin key.";
    } else {
      text = "This gateway needs an admin key. Enter one above: it stays in this tab only.";
    }
    hint.textContent = text;
    hint.hidden = false;
    document.body.dataset.auth = "needed";
    const input = $("#key");
    if (document.activeElement !== input && !input.value) input.focus();
  }

  function clearAll() {
    for (const s of SOURCES) delete latest[s.name];
    $("#workers tbody").replaceChildren();
    for (const s of ["#queue", "#rollouts", "#routes", "#programs", "#replicas"]) $(s + " .body").replaceChildren();
    for (const s of SOURCES) setMeta("#" + s.name, "");
  }

  function setStatus(text, health) {
    $("#status").textContent = text;
    document.body.dataset.health = health;
  }

  async function poll() {
    if (running) {
      again = true;
      return;
    }
    running = true;
    clearTimeout(timer);
    const started = performance.now();
    const ctl = new AbortController();
    const stop = setTimeout(() => ctl.abort(), TIMEOUT_MS);
    const usedKey = key;
    const results = await Promise.allSettled(SOURCES.map((s) => fetchJSON(s.path, ctl.signal)));
    clearTimeout(stop);
    const took = Math.round(performance.now() - started);
    if (usedKey === key) { // a key typed meanwhile makes this round moot
      const errs = [];
      results.forEach((r, i) => {
        const s = SOURCES[i];
        const sec = $("#" + s.name);
        if (r.status === "fulfilled") {
          latest[s.name] = r.value;
          try {
            s.render(r.value);
            sec.classList.remove("stale");
          } catch (e) {
            errs.push(Object.assign(new APIError(0, "render", e.message), { source: s.name }));
            sec.classList.add("stale");
          }
        } else {
          errs.push(Object.assign(r.reason, { source: s.name }));
          sec.classList.add("stale");
        }
      });
      const denied = authProblem(errs);
      if (denied) clearAll(); // nothing read with a refused key stays on screen
      renderSummary();
      showAuth(denied);
      const mode = key ? "admin key (this tab)" : "open mode";
      if (errs.length === 0) {
        lastGood = new Date();
        setStatus("live · updated " + clock(lastGood) + " · " + took + " ms · " + mode, "ok");
      } else {
        const bySource = new Map(); // one message once, with the sources that got it
        for (const e of errs) bySource.set(e.message, [...(bySource.get(e.message) || []), e.source]);
        const what = [...bySource].map(([msg, srcs]) => (srcs.length === SOURCES.length ? "all" : srcs.join(", ")) + ": " + msg).join("; ");
        const since = lastGood ? " · last full update " + clock(lastGood) : "";
        setStatus("error · " + clock(new Date()) + " · " + what + since, authProblem(errs) ? "auth" : "error");
      }
    }
    running = false;
    if (again) {
      again = false;
      timer = setTimeout(poll, 0);
    } else {
      timer = setTimeout(poll, Math.max(0, POLL_MS - took));
    }
  }

  // ---- the key ----

  function readKey() {
    try {
      return sessionStorage.getItem(KEY_STORE) || "";
    } catch (e) {
      return "";
    }
  }

  function storeKey(k) {
    try {
      if (k) sessionStorage.setItem(KEY_STORE, k);
      else sessionStorage.removeItem(KEY_STORE);
    } catch (e) {
      // the variable still holds it for this page's life
    }
  }

  function init() {
    const form = $("#keyform");
    const input = $("#key");
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      key = input.value.trim();
      input.value = "";
      input.placeholder = key ? "key set (this tab only)" : "kept in this tab only";
      storeKey(key);
      poll();
    });
    $("#forget").addEventListener("click", () => {
      key = "";
      input.value = "";
      input.placeholder = "kept in this tab only";
      storeKey("");
      poll();
    });
    if (key) input.placeholder = "key set (this tab only)";
    poll();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();

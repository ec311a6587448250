// The per-question view's own script (ragbench/report/explore.py fills __VID__ and the
// itables names). Hand-written: the filters over pairs of variants, their counts and the
// expanded evidence; DataTables (itables' offline bundle) draws, sorts and pages the table.
// Text goes through esc() before it reaches innerHTML.
(() => {
const VID = "__VID__";
const root = document.getElementById(VID);
if (!root || root.dataset.ready) return;
root.dataset.ready = "1";
const D = JSON.parse(document.getElementById(VID + "-data").textContent);
const V = D.variants, Q = D.questions, FOLD = 400;
const esc = s => String(s ?? "").replace(/[&<>"']/g,
  c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const num = (x, d) => x == null ? "n/a" : Number(x).toFixed(d);
const ok = c => c && !c.err && c.s != null ? (D.binary ? c.s >= 1 : null) : null;
const scored = c => c && !c.err && c.s != null;
const state = {a: Math.min(D.pair[0], V.length - 1), b: Math.min(D.pair[1], V.length - 1),
  outcome: "all", cause: "", doc: "",
  match: null};

function pairOf(q) {  // -1: A better, 1: B better, 0: same, null: not both scored
  const ca = q.c[state.a], cb = q.c[state.b];
  if (!scored(ca) || !scored(cb)) return null;
  return ca.s > cb.s ? -1 : ca.s < cb.s ? 1 : 0;
}
const OUTCOMES = {
  all: () => true,
  a_only: q => pairOf(q) === -1,
  b_only: q => pairOf(q) === 1,
  both_wrong: q => { const c = [q.c[state.a], q.c[state.b]];
    return c.every(scored) && c.every(x => D.binary ? x.s < 1 : x.s <= 0); },
  disagree: q => new Set(q.c.filter(scored).map(c => c.s)).size > 1,
};
function keep(q) {
  if (!OUTCOMES[state.outcome](q)) return false;
  if (state.cause && !q.c.some(c => c && c.cause === state.cause)) return false;
  if (state.doc && !q.docs.includes(state.doc)) return false;
  if (state.match && ![q.id, q.q, ...q.a, ...q.c.map(c => c ? c.p : "")].some(state.match))
    return false;
  return true;
}

function cellHtml(c) {
  if (!c) return '<span class="rbv-na">not run</span>';
  if (c.err) return '<span class="rbv-bad">error</span> <span class="rbv-meta">' +
    esc(c.err.slice(0, 200)) + "</span>";
  const mark = c.s == null ? '<span class="rbv-na">unscored</span>' : D.binary
    ? (c.s >= 1 ? '<span class="rbv-ok">\u2713</span>' : '<span class="rbv-bad">\u2717</span>')
    : '<span class="rbv-meta">' + esc(D.metric) + " " + num(c.s, 3) + "</span>";
  return mark + " " + esc(c.p || "(empty answer)") + '<div class="rbv-meta">$' +
    num(c.d, 4) + " / 1k \u00b7 " + num(c.l, 2) + " s" +
    (c.cause && c.cause !== "correct" ? " \u00b7 " + esc(c.cause) : "") + "</div>";
}
function chunkHtml(ref, score, id, gold, doc, text, cls) {
  const ch = ref != null ? D.chunks[ref] : null;
  const body = text ?? (ch ? ch[1] : null), src = doc ?? (ch ? ch[0] : "");
  const head = esc(id) + (score != null ? " \u00b7 score " + num(score, 3) : "") +
    (src ? " \u00b7 " + esc(src) : "") + (gold ? " \u00b7 gold" : "");
  if (body == null) return '<div class="rbv-chunk ' + cls + '">' + head +
    ' <span class="rbv-na">(text not stored in this run folder)</span></div>';
  if (body.length <= FOLD) return '<div class="rbv-chunk ' + cls + '"><div class="rbv-meta">' +
    head + "</div>" + esc(body) + "</div>";
  return '<details class="rbv-chunk ' + cls + '"><summary><span class="rbv-meta">' + head +
    "</span><br>" + esc(body.slice(0, FOLD)) + "\u2026</summary>" + esc(body.slice(FOLD)) +
    "</details>";
}
function detailHtml(q) {
  const parts = q.c.map((c, i) => {
    if (!c) return "";
    let h = "<div><h4>" + esc(V[i].label) + "</h4>" + cellHtml(c);
    const sc = Object.entries(c.sc).map(([k, v]) => esc(k) + " " + num(v, 3)).join(" \u00b7 ");
    if (sc) h += '<div class="rbv-meta">' + sc + "</div>";
    if (c.cause) h += '<div class="rbv-meta">outcome: ' + esc(c.cause) + "</div>";
    const ev = c.ev || {};
    if (ev.route) h += '<div class="rbv-meta">route: ' + esc(ev.route) + "</div>";
    if (ev.r) {
      h += '<div class="rbv-meta">retrieved (rank order)' +
        (ev.hit === true ? ": gold retrieved" : ev.hit === false ? ": gold NOT retrieved" : "") +
        "</div>";
      h += ev.r.map(r => chunkHtml(r[0], r[1], r[2], r[3], r[4], r[5],
                                   r[3] ? "rbv-gold" : "")).join("");
      h += (ev.miss || []).map(m => chunkHtml(m[0], null, m[1] + " (gold, not retrieved)",
                                              true, null, null, "rbv-missed")).join("");
    }
    if (ev.lc) h += '<div class="rbv-meta">long context kept ' + esc(ev.lc.kept_tokens) +
      " tokens, cut " + esc(ev.lc.truncated_tokens ?? 0) + "; evidence cut: " +
      esc(ev.lc.evidence_truncated ?? "unknown") + "; documents dropped: " +
      esc(JSON.stringify(ev.lc.dropped_documents ?? 0)) + "</div>";
    for (const [k, v] of Object.entries(c.j || {}))
      h += '<div class="rbv-meta">' + esc(k) + ": " + esc(v) + "</div>";
    return h + "</div>";
  });
  return '<div class="rbv-detail">' + parts.join("") + "</div>";
}

function select(name, options, onChange) {
  const label = document.createElement("label");
  label.textContent = name + " ";
  const sel = document.createElement("select");
  sel.dataset.filter = name;
  options.forEach(([value, text]) => sel.add(new Option(text, value)));
  sel.addEventListener("change", () => onChange(sel.value));
  label.appendChild(sel);
  return [label, sel];
}

async function start() {
  const lib = await window.__ITABLES__;
  const DT = lib.default;  // DataTable itself (ITable is itables' wrapper, which takes no data option)
  if (D.missing.length) document.getElementById(VID + "-missing").textContent =
    "Not in the run folder (written before ragbench kept it): " + D.missing.join("; ");
  const columns = [
    {title: "id", data: "id"},
    {title: "question", data: "q", render: (q, t) => t === "display" ? esc(q) : q},
    {title: "gold", data: "a", render: (a, t) => t === "display" ? esc(a.join(" | ")) : a.join(" ")},
    ...V.map((v, i) => ({title: v.label, data: row => row.c[i], render: (c, t) =>
      t === "display" ? cellHtml(c) : t === "sort" || t === "type"
        ? (c && c.s != null && !c.err ? c.s : -1) : (c ? c.p : "")})),
  ];
  const table = document.getElementById(VID + "-table");
  columns.forEach(c => { c.className = "dt-left"; });
  const dt = new DT(table, {data: Q, columns, deferRender: true, pageLength: 25,
    order: [], autoWidth: false, searching: true,
    layout: {topStart: "pageLength", topEnd: null}});
  const bar = document.getElementById(VID + "-bar");
  const search = document.createElement("input");
  search.type = "search"; search.placeholder = "search question, answers, predictions";
  search.size = 40; search.dataset.filter = "search";
  const regex = document.createElement("input");
  regex.type = "checkbox"; regex.dataset.filter = "regex";
  const rl = document.createElement("label");
  rl.append(regex, " regex");
  const apply = () => {  // over each text on its own, so a regex's ^ and $ mean its ends
    state.match = null;
    search.setCustomValidity("");
    if (search.value) {
      try {
        const re = new RegExp(regex.checked ? search.value
          : search.value.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"), "i");
        state.match = t => re.test(t);
      } catch (e) { search.setCustomValidity(String(e)); search.reportValidity(); }
    }
    dt.draw();
  };
  search.addEventListener("input", apply); regex.addEventListener("change", apply);
  const names = V.map((v, i) => [String(i), v.label]);
  const [la, sa] = select("A", names, v => { state.a = +v; counts(); dt.draw(); });
  const [lb, sb] = select("B", names, v => { state.b = +v; counts(); dt.draw(); });
  sa.value = String(state.a);
  sb.value = String(state.b);
  const [lo, so] = select("outcome", [["all", "all"]], v => { state.outcome = v; dt.draw(); });
  const causeCount = {}, docCount = {};
  Q.forEach(q => {
    new Set(q.c.filter(c => c).map(c => c.cause)).forEach(c => causeCount[c] = (causeCount[c] || 0) + 1);
    q.docs.forEach(d => docCount[d] = (docCount[d] || 0) + 1);
  });
  const [lc] = select("cause", [["", "any cause"], ...Object.keys(causeCount).sort()
    .map(c => [c, c + " (" + causeCount[c] + ")"])], v => { state.cause = v; dt.draw(); });
  const [ld] = select("source document", [["", "any document"], ...Object.keys(docCount).sort()
    .map(d => [d, d + " (" + docCount[d] + ")"])], v => { state.doc = v; dt.draw(); });
  bar.append(search, rl, la, lb, lo, lc, ld);
  function counts() {
    const n = k => Q.filter(OUTCOMES[k]).length;
    const A = V[state.a].label, B = V[state.b].label;
    const good = D.binary ? [" right, ", " wrong"] : [" higher than ", ""];
    const opts = [["all", "all (" + Q.length + ")"],
      ["a_only", "A" + good[0] + "B" + good[1] + " (" + n("a_only") + ")"],
      ["b_only", "B" + good[0] + "A" + good[1] + " (" + n("b_only") + ")"],
      ["both_wrong", "both wrong (" + n("both_wrong") + ")"],
      ["disagree", "any disagreement (" + n("disagree") + ")"]];
    const was = so.value;
    so.innerHTML = "";
    opts.forEach(([v, t]) => so.add(new Option(t, v)));
    so.value = was || "all";
    so.title = "A: " + A + "\nB: " + B;
  }
  counts();
  DT.ext.search.push((settings, _data, i) =>
    settings.nTable !== table || keep(Q[i]));
  table.addEventListener("click", ev => {
    const tr = ev.target.closest("tbody > tr");
    if (!tr || tr.classList.contains("child") || ev.target.closest("details")) return;
    const row = dt.row(tr);
    if (!row.data()) return;
    if (row.child.isShown()) { row.child.hide(); tr.classList.remove("rbv-open"); }
    else { row.child(detailHtml(row.data())).show(); tr.classList.add("rbv-open"); }
  });
  root.dataset.rows = String(Q.length);
  root.dataset.shownMs = String(Math.round(performance.now()));  // since the page began loading
  root.dataset.loaded = "1";
}
if (window.__ITABLES__) start();
else window.addEventListener("__ITABLES_READY__", start, {once: true});
})();

// Live build page: poll the status endpoint, update the matrix, log lines and artifacts.
(function () {
  "use strict";
  const root = document.getElementById("build");
  if (!root) return;
  const statusUrl = root.dataset.statusUrl, logUrl = root.dataset.logUrl;
  let lastEvent = 0, logKernel = "", done = root.dataset.terminal === "1";
  document.querySelectorAll("#events li").forEach(li => { lastEvent = Math.max(lastEvent, +li.dataset.id); });

  function text(el, value) { if (el && el.textContent !== value) el.textContent = value; }

  function render(s) {
    const state = document.getElementById("state");
    state.className = "state " + s.state; text(state, s.state);
    text(document.getElementById("package"), (s.name + " " + s.version).trim());
    const err = document.getElementById("error");
    if (s.error) { err.hidden = false; text(err, "[" + s.error.code + "] " + s.error.message); }
    for (const k of s.kernels) {
      const row = document.querySelector('#matrix tr[data-kernel="' + CSS.escape(k.kernel_release) + '"]');
      if (!row) continue;
      row.querySelectorAll("td.cell").forEach(c => { c.className = "cell " + k.state; text(c, k.state); });
      text(row.querySelector("td.diagnosis"), k.diagnosis);
      text(row.querySelector("td.time"), k.duration ? k.duration.toFixed(1) + "s" : "");
    }
    const events = document.getElementById("events");
    for (const e of s.events) {
      const li = document.createElement("li");
      li.dataset.id = e.id; li.className = e.kind; li.textContent = e.message;
      events.appendChild(li); lastEvent = Math.max(lastEvent, e.id);
    }
    const list = document.getElementById("artifacts");
    if (s.artifacts.length && list.children.length !== s.artifacts.length) {
      list.replaceChildren(...s.artifacts.map(a => {
        const li = document.createElement("li"), link = document.createElement("a");
        link.href = statusUrl.replace(/status$/, "artifacts/" + encodeURIComponent(a.filename));
        link.textContent = a.filename; li.appendChild(link); return li;
      }));
    }
  }

  async function refreshLog() {
    const r = await fetch(logUrl + (logKernel ? "?kernel=" + encodeURIComponent(logKernel) : ""));
    if (r.ok) text(document.getElementById("logtext"), await r.text());
  }

  async function poll() {
    try {
      const r = await fetch(statusUrl + "?after=" + lastEvent, {headers: {Accept: "application/json"}});
      if (r.ok) {
        const s = await r.json();
        render(s);
        await refreshLog();
        if (s.terminal) { done = true; if (!document.querySelector("#install pre")) location.reload(); return; }
      }
    } catch (e) { /* the next poll retries */ }
    setTimeout(poll, 2000);
  }

  document.querySelectorAll("[data-log-kernel]").forEach(a => a.addEventListener("click", () => {
    logKernel = a.dataset.logKernel; refreshLog();
  }));
  if (!done) setTimeout(poll, 1000);
})();

// The Paddock dashboard: everything it shows comes from the gateway's own routes (/v1/…, /metrics),
// so it works against any gateway and needs no build step. Streams are read with fetch, not
// EventSource, because EventSource cannot send an Authorization header.


const $ = (sel) => document.querySelector(sel);
const el = (tag, { dataset, ...props } = {}, ...kids) => {
  const e = Object.assign(document.createElement(tag), props);
  Object.assign(e.dataset, dataset);
  for (const k of kids) e.append(k);
  return e;
};

let key = localStorage.getItem('paddock.key') || '';
const authHeaders = () => (key ? { authorization: `Bearer ${key}` } : {});

async function api(path, init = {}) {
  const res = await fetch(path, { ...init, headers: { ...authHeaders(), ...(init.headers || {}) } });
  if (res.status === 401 || res.status === 403) {
    $('#keyform').hidden = false;
    throw new Error(`${res.status}: an API key is needed`);
  }
  if (!res.ok) {
    const body = await res.json().catch(() => ({ message: res.statusText }));
    throw new Error(`${body.code || res.status}: ${body.message}`);
  }
  return res;
}
const getJson = async (path) => (await api(path)).json();

/** Calls `onEvent(name, data)` for each Server-Sent Event of a response body until it ends or `signal` aborts. */
async function readSse(res, onEvent) {
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += dec.decode(value, { stream: true });
    for (let i = buf.indexOf('\n\n'); i >= 0; i = buf.indexOf('\n\n')) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      let name = 'message';
      let data = '';
      for (const line of block.split('\n')) {
        if (line.startsWith('event: ')) name = line.slice(7);
        else if (line.startsWith('data: ')) data += line.slice(6);
      }
      if (data) onEvent(name, JSON.parse(data));
    }
  }
}

$('#keyform').addEventListener('submit', (e) => {
  e.preventDefault();
  key = $('#key').value.trim();
  localStorage.setItem('paddock.key', key);
  $('#keyform').hidden = true;
  start();
});

// ─── Home: nodes, sandboxes, rates, events ──────────────────────────────────────────────────────

const sandboxes = new Map();
const ENDED = new Set(['stopped', 'failed']);

function age(ms) {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  return s < 60 ? `${s}s` : s < 3600 ? `${Math.round(s / 60)}m` : `${Math.round(s / 3600)}h`;
}

function renderSandboxes() {
  const body = $('#sandboxes tbody');
  const rows = [...sandboxes.values()].filter((s) => !ENDED.has(s.state)).sort((a, b) => a.createdAt - b.createdAt);
  body.replaceChildren(
    ...rows.map((s) =>
      el(
        'tr',
        { dataset: { id: s.id } },
        el('td', {}, el('a', { href: `#/sb/${s.id}`, textContent: s.id })),
        el('td', {}, el('span', { className: `state ${s.state}`, textContent: s.state })),
        el('td', { textContent: s.node }),
        el('td', { textContent: s.group || '' }),
        el('td', { textContent: Object.entries(s.labels || {}).map(([k, v]) => `${k}=${v}`).join(' ') }),
        el('td', { textContent: s.image }),
        el('td', { textContent: age(s.createdAt) }),
      ),
    ),
  );
  const count = (f) => {
    const m = new Map();
    for (const s of rows) m.set(f(s), (m.get(f(s)) || 0) + 1);
    return [...m.entries()].sort();
  };
  const li = ([k, n]) => el('li', {}, el('span', { textContent: k }), el('b', { textContent: String(n) }));
  $('#bystate').replaceChildren(...count((s) => s.state).map(li));
  $('#bygroup').replaceChildren(...count((s) => s.group || '(none)').map(li));
}

async function refreshSandboxes() {
  const asked = Date.now();
  const { sandboxes: list } = await getJson('/v1/sandboxes?state=creating,running,pausing,paused,resuming,hibernating,hibernated,restoring,stopping');
  const seen = new Set(list.map((s) => s.id));
  // An event that came while the listing was on its way is newer than the listing.
  for (const [id, s] of sandboxes) if (!seen.has(id) && s.seenAt < asked) sandboxes.delete(id);
  for (const s of list) if (!(sandboxes.get(s.id)?.seenAt >= asked)) sandboxes.set(s.id, { ...s, seenAt: asked });
  renderSandboxes();
}

async function refreshNodes() {
  const { nodes } = await getJson('/v1/nodes');
  const pct = (a, c) => (c ? `${a}/${c} (${Math.round((100 * a) / c)}%)` : `${a}`);
  $('#nodes tbody').replaceChildren(
    ...nodes.map((n) =>
      el(
        'tr',
        {},
        el('td', { textContent: n.node }),
        el('td', { textContent: Date.now() - n.ts > 3 * n.heartbeatMs ? 'gone' : n.state }),
        el('td', { textContent: (n.backends || []).join(', ') }),
        el('td', { textContent: pct(n.allocated?.sandboxes ?? n.sandboxes, n.capacity?.sandboxes) }),
        el('td', { textContent: pct(+(n.allocated?.cpu ?? 0).toFixed(2), n.capacity?.cpu) }),
        el('td', { textContent: `${pct(n.allocated?.memoryMiB ?? 0, n.capacity?.memoryMiB)} MiB` }),
        el('td', { textContent: n.fn ? `${n.fn.running} running, ${n.fn.queued} queued` : '—' }),
      ),
    ),
  );
}

/** Sums of a counter (or a histogram's _sum/_count) over the series whose labels match. */
function metricSum(text, name, match) {
  let total = 0;
  for (const line of text.split('\n')) {
    if (!line.startsWith(name)) continue;
    const m = /^(\w+)(\{[^}]*\})? ([0-9.eE+-]+)$/.exec(line);
    if (!m || m[1] !== name) continue;
    if (match && !match(m[2] || '')) continue;
    total += Number(m[3]);
  }
  return total;
}

const WINDOW = 90;
const charts = {};
let lastSample;

function makeCharts() {
  if (typeof Chart === 'undefined' || charts.rates) return;
  Chart.defaults.color = '#7b8496';
  Chart.defaults.borderColor = '#262b36';
  const opts = { animation: false, responsive: true, maintainAspectRatio: false, scales: { x: { ticks: { maxTicksLimit: 6 } }, y: { beginAtZero: true } } };
  const ds = (label, color) => ({ label, data: [], borderColor: color, backgroundColor: color, pointRadius: 0, tension: 0.2 });
  charts.rates = new Chart($('#rates'), { type: 'line', data: { labels: [], datasets: [ds('creates/s', '#6cb6ff'), ds('execs/s', '#7ee787')] }, options: opts });
  charts.latency = new Chart($('#latency'), { type: 'line', data: { labels: [], datasets: [ds('create', '#6cb6ff'), ds('exec', '#7ee787')] }, options: opts });
}

async function refreshRates() {
  const text = await (await api('/metrics')).text();
  const create = (l) => l.includes('route="/v1/sandboxes"') && l.includes('method="POST"');
  const exec = (l) => l.includes('route="/v1/sandboxes/:id/exec"');
  const now = {
    t: Date.now(),
    creates: metricSum(text, 'paddock_gateway_http_request_duration_seconds_count', create),
    createSec: metricSum(text, 'paddock_gateway_http_request_duration_seconds_sum', create),
    execs: metricSum(text, 'paddock_gateway_http_request_duration_seconds_count', exec),
    execSec: metricSum(text, 'paddock_gateway_http_request_duration_seconds_sum', exec),
  };
  const prev = lastSample;
  lastSample = now;
  if (!prev || !charts.rates) return;
  const dt = (now.t - prev.t) / 1000;
  const label = new Date(now.t).toLocaleTimeString();
  const push = (chart, values) => {
    chart.data.labels.push(label);
    for (const [i, v] of values.entries()) chart.data.datasets[i].data.push(v);
    if (chart.data.labels.length > WINDOW) {
      chart.data.labels.shift();
      for (const d of chart.data.datasets) d.data.shift();
    }
    chart.update('none');
  };
  const mean = (sec, n) => (n > 0 ? (1000 * sec) / n : null);
  push(charts.rates, [(now.creates - prev.creates) / dt, (now.execs - prev.execs) / dt]);
  push(charts.latency, [mean(now.createSec - prev.createSec, now.creates - prev.creates), mean(now.execSec - prev.execSec, now.execs - prev.execs)]);
}

let eventsAbort;
async function followEvents() {
  eventsAbort?.abort();
  eventsAbort = new AbortController();
  const res = await api('/v1/events', { signal: eventsAbort.signal });
  await readSse(res, (name, rec) => {
    if (name !== 'sandbox') return;
    sandboxes.set(rec.id, { ...rec, seenAt: Date.now() });
    renderSandboxes();
    const list = $('#events');
    list.prepend(el('li', { textContent: `${new Date().toLocaleTimeString()} ${rec.id} ${rec.state}${rec.reason ? ` (${rec.reason})` : ''}` }));
    while (list.children.length > 200) list.lastChild.remove();
    if (current && current.id === rec.id) showRecord(rec);
  });
}

// ─── A sandbox's page: its record, a terminal (a shell on a PTY, or commands over exec), its execs ──

let current;
let term;
let fit;

function showRecord(rec) {
  current = rec;
  $('#sbid').textContent = rec.id;
  $('#sbstate').textContent = rec.state;
  $('#sbstate').className = `state ${rec.state}`;
  $('#record').textContent = JSON.stringify(rec, null, 2);
}

function makeTerminal() {
  if (term) return;
  term = new Terminal({ convertEol: true, cursorBlink: true, fontSize: 13, theme: { background: '#0b0d11' } });
  fit = new FitAddon.FitAddon();
  term.loadAddon(fit);
  term.open($('#terminal'));
  let line = '';
  let running;
  const prompt = () => term.write('\x1b[32m$\x1b[0m ');
  term.onData(async (d) => {
    // A shell on a PTY takes every key as it is; the exec line below is for backends without one.
    // Keys typed while the shell is being opened wait for it.
    if (pendingKeys) return void pendingKeys.push(d);
    if (shell) return shell.send(d);
    if (running) {
      // Ctrl-C ends the running command: closing its stream kills it in the sandbox.
      if (d === '\x03') running.abort();
      return;
    }
    if (d === '\r') {
      term.write('\r\n');
      const cmd = line;
      line = '';
      if (!cmd.trim()) return prompt();
      running = new AbortController();
      await runInTerminal(cmd, running.signal).catch((err) => term.write(`\x1b[31m${err.message}\x1b[0m\r\n`));
      running = undefined;
      prompt();
    } else if (d === '\x7f') {
      if (line.length > 0) {
        line = line.slice(0, -1);
        term.write('\b \b');
      }
    } else if (d >= ' ' || d === '\t') {
      line += d;
      term.write(d);
    }
  });
  term.prompt = prompt;
}

// A shell on a pseudo-terminal in the sandbox (POST …/processes with `pty`): keys go to its input in
// order, its output (base64 over SSE) to the terminal as bytes, and a resize of the page to it.
let shell;
let pendingKeys;

async function openShell(id) {
  const sbPath = `/v1/sandboxes/${encodeURIComponent(id)}`;
  const res = await api(`${sbPath}/processes`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ pty: { cols: term.cols, rows: term.rows }, tag: 'dashboard' }) });
  const info = await res.json();
  const pPath = `${sbPath}/processes/${encodeURIComponent(info.id)}`;
  if (current?.id !== id) {
    // The page moved on while the shell was being started: it is nobody's.
    void api(`${pPath}/kill`, { method: 'POST' }).catch(() => {});
    throw new Error('the page moved on');
  }
  const ac = new AbortController();
  let queue = Promise.resolve();
  const post = (what, body) => {
    queue = queue.then(() => api(`${pPath}/${what}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })).catch((err) => {
      if (!ac.signal.aborted) showError(err);
    });
  };
  const s = {
    id,
    send: (d) => post('input', { text: d }),
    resize: () => post('resize', { cols: term.cols, rows: term.rows }),
    close: () => {
      ac.abort();
      // keepalive: the kill still goes out when the tab is closing (pagehide below).
      void api(`${pPath}/kill`, { method: 'POST', keepalive: true }).catch(() => {});
    },
  };
  shell = s;
  term.options.convertEol = false;
  void (async () => {
    try {
      const out = await api(`${pPath}/output?encoding=base64`, { signal: ac.signal, headers: { accept: 'text/event-stream' } });
      await readSse(out, (name, data) => {
        if ((name === 'stdout' || name === 'stderr') && data.data) term.write(Uint8Array.from(atob(data.data), (c) => c.charCodeAt(0)));
        else if (name === 'exit') term.write(`\r\n\x1b[2m[the shell ended: exit ${data.exitCode}]\x1b[0m\r\n`);
        else if (name === 'error') term.write(`\r\n\x1b[31m${data.code}: ${data.message}\x1b[0m\r\n`);
      });
    } catch (err) {
      if (!ac.signal.aborted) showError(err);
    }
    if (shell === s) shell = undefined;
  })();
}

function closeShell() {
  shell?.close();
  shell = undefined;
  if (term) term.options.convertEol = true;
}

window.addEventListener('pagehide', () => closeShell());

window.addEventListener('resize', () => {
  if (!term || $('#sandbox').hidden) return;
  fit.fit();
  shell?.resize();
});

async function runInTerminal(cmd, signal) {
  const started = Date.now();
  const res = await api(`/v1/sandboxes/${current.id}/exec`, { method: 'POST', signal, headers: { 'content-type': 'application/json', accept: 'text/event-stream' }, body: JSON.stringify({ cmd, timeoutMs: 600000 }) });
  let exit;
  try {
    await readSse(res, (name, data) => {
      if (name === 'stdout') term.write(data.text);
      else if (name === 'stderr') term.write(`\x1b[33m${data.text}\x1b[0m`);
      else if (name === 'exit') exit = data;
      else if (name === 'error') term.write(`\x1b[31m${data.code}: ${data.message}\x1b[0m\r\n`);
    });
  } catch (err) {
    if (!signal.aborted) throw err;
    term.write('^C\r\n');
  }
  const item = `${new Date(started).toLocaleTimeString()} ${cmd} → ${exit ? `exit ${exit.exitCode}${exit.verdict !== 'OK' ? ` ${exit.verdict}` : ''} in ${Math.round(exit.durationMs)} ms` : 'cancelled'}`;
  $('#execs').prepend(el('li', { textContent: item }));
  while ($('#execs').children.length > 50) $('#execs').lastChild.remove();
}

// A full VM's screen: a screenshot a second while it runs (taken by the VMM; a paused VM is not
// woken for it), and a link to its live view (noVNC on the node, view only).
let screenTimer;
let screenUrl;
async function refreshScreen() {
  if (!current || current.backend !== 'fullvm' || current.state !== 'running') return;
  const id = current.id;
  const blob = await (await api(`/v1/sandboxes/${encodeURIComponent(id)}/display/screenshot`)).blob();
  if (!current || current.id !== id) return;
  if (screenUrl) URL.revokeObjectURL(screenUrl);
  screenUrl = URL.createObjectURL(blob);
  $('#screen').src = screenUrl;
}

function showScreen(rec) {
  clearInterval(screenTimer);
  const gui = rec.backend === 'fullvm';
  $('#screencard').hidden = !gui;
  if (!gui) return;
  const tick = () => refreshScreen().catch(showError);
  void tick();
  screenTimer = setInterval(tick, 1000);
}

$('#liveview').addEventListener('click', async (e) => {
  e.preventDefault();
  try {
    const { url } = await getJson(`/v1/sandboxes/${encodeURIComponent(current.id)}/display/view`);
    window.open(url, '_blank', 'noopener');
  } catch (err) {
    showError(err);
  }
});

async function openSandbox(id) {
  $('#home').hidden = true;
  $('#sandbox').hidden = false;
  $('#execs').replaceChildren();
  showRecord(await getJson(`/v1/sandboxes/${encodeURIComponent(id)}`));
  showScreen(current);
  makeTerminal();
  closeShell();
  term.reset();
  fit.fit();
  // Terminals are a container's (the processes capability); a VM gets commands over exec, asked
  // for without a request that would only be refused (the browser logs every 400 it sees).
  if (current.backend === 'container') pendingKeys = [];
  const why = current.backend !== 'container' ? `a ${current.backend} has no terminals` : await openShell(id).then(
    () => undefined,
    (err) => err.message,
  );
  const early = pendingKeys ?? [];
  pendingKeys = undefined;
  if (shell && early.length > 0) shell.send(early.join(''));
  if (why !== undefined) {
    term.write(`\x1b[2mno shell (${why}); commands run in ${id} through /bin/sh -c; Ctrl-C stops one\x1b[0m\r\n`);
    term.prompt();
  }
  term.focus();
}

// ─── Routing and polling ────────────────────────────────────────────────────────────────────────

async function route() {
  const m = /^#\/sb\/([A-Za-z0-9_-]+)$/.exec(location.hash);
  if (m) return openSandbox(m[1]);
  current = undefined;
  closeShell();
  clearInterval(screenTimer);
  $('#sandbox').hidden = true;
  $('#home').hidden = false;
}
window.addEventListener('hashchange', () => route().catch(showError));

function showError(err) {
  $('#status').textContent = err.message;
}

let timer;
async function tick() {
  try {
    await Promise.all([refreshNodes(), refreshSandboxes(), refreshRates()]);
    $('#status').textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (err) {
    showError(err);
  }
}

function start() {
  const h = /[#&]key=([^&]+)/.exec(location.hash);
  if (h) {
    key = decodeURIComponent(h[1]);
    localStorage.setItem('paddock.key', key);
    history.replaceState(null, '', location.pathname);
  }
  makeCharts();
  clearInterval(timer);
  void tick();
  timer = setInterval(tick, 2000);
  followEvents().catch((err) => {
    if (err.name !== 'AbortError') showError(err);
  });
  route().catch(showError);
}

start();

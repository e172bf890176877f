/**
 * The HTTP/JSON gateway: each route is one SDK call (the same NATS requests the SDK makes), so a
 * gateway holds no state of its own and any number of them can serve one Paddock. Streams (exec
 * output, lifecycle events) are Server-Sent Events; file bodies are raw bytes moved chunk by chunk.
 */
import { createServer, request as httpRequest, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { Readable } from 'node:stream';
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest, type RouteOptions } from 'fastify';
import { decode, GroupVerbs, isToken, Limits, type SandboxInfo, SandboxStates, subjects } from '../../protocol/index.ts';
import { connectionOf } from '../../sdk/client.ts';
import type { CreateSpec, ExecOptions, ListOptions, Paddock, Sandbox } from '../../sdk/index.ts';
import { authenticate, type KeySet } from './auth.ts';
import { serveDashboard } from './dashboard.ts';
import { GatewayError, httpError, sendError } from './errors.ts';
import { type GatewayMetrics, gatewayMetrics } from './metrics.ts';
import { openApiDocument } from './openapi.ts';
import { type Route, Routes } from './routes.ts';
import { Backlog, JsonText, SseWriter, slices } from './sse.ts';

export interface GatewayOptions {
  pdk: Paddock;
  keys: KeySet;
  /** Server-Sent Event streams open at once per key (or per loopback without keys). */
  maxStreamsPerKey?: number;
  /** Lifecycle events an /v1/events stream holds for a reader that has not taken them (default 10,000); past it they are counted and said as one `gap`. */
  eventsBacklog?: number;
  /** Largest JSON body (an exec's stdin counts). */
  bodyLimit?: number;
  /** Largest request head, in bytes. */
  maxHeaderSize?: number;
  metrics?: GatewayMetrics;
}

declare module 'fastify' {
  interface FastifyRequest {
    caller: string;
  }
}

type Req = FastifyRequest<{ Params: Record<string, string>; Querystring: Record<string, string | string[] | undefined>; Body: unknown }>;

function str(q: Req['query'], k: string): string | undefined {
  const v = q[k];
  return Array.isArray(v) ? v[v.length - 1] : v;
}
function list(q: Req['query'], k: string): string[] {
  const v = q[k];
  if (v === undefined) return [];
  return (Array.isArray(v) ? v : [v]).flatMap((s) => s.split(',')).filter((s) => s.length > 0);
}
function flag(q: Req['query'], k: string): boolean {
  const v = str(q, k);
  return v !== undefined && v !== '0' && v !== 'false';
}
function num(q: Req['query'], k: string): number | undefined {
  const v = str(q, k);
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isFinite(n)) throw new GatewayError('INVALID_REQUEST', `${k}: must be a number, got ${JSON.stringify(v)}`);
  return n;
}
function object(body: unknown, what: string): Record<string, unknown> {
  if (body === undefined || body === null) return {};
  if (typeof body !== 'object' || Array.isArray(body) || body instanceof Readable) throw new GatewayError('INVALID_REQUEST', `${what}: the body must be a JSON object`);
  return body as Record<string, unknown>;
}
function token(v: string | undefined, what: string): string {
  if (!isToken(v)) throw new GatewayError('INVALID_REQUEST', `${what}: must be 1-64 characters of [A-Za-z0-9_-], got ${JSON.stringify(v)}`);
  return v;
}
function path(q: Req['query']): string {
  const p = str(q, 'path');
  if (!p) throw new GatewayError('INVALID_REQUEST', 'path: the query parameter is required (an absolute path inside the sandbox)');
  return p;
}

/** `label=k=v` (repeatable, or comma-separated) as the SDK's label filter. */
function labels(q: Req['query']): Record<string, string> | undefined {
  const out: Record<string, string> = {};
  for (const kv of list(q, 'label')) {
    const i = kv.indexOf('=');
    if (i <= 0) throw new GatewayError('INVALID_REQUEST', `label: expected key=value, got ${JSON.stringify(kv)}`);
    out[kv.slice(0, i)] = kv.slice(i + 1);
  }
  return Object.keys(out).length > 0 ? out : undefined;
}

/** Exec options from a JSON body: `cmd` (a string for /bin/sh -c, or argv), cwd, env, stdin, timeoutMs, maxOutputBytes, rolloutId, step. */
function execArgs(body: unknown): { cmd: string | string[]; opts: ExecOptions } {
  const b = object(body, 'exec');
  const cmd = b.cmd;
  if (!(typeof cmd === 'string' || (Array.isArray(cmd) && cmd.every((a) => typeof a === 'string')))) {
    throw new GatewayError('INVALID_REQUEST', 'cmd: must be a string (run by /bin/sh -c) or an array of strings', 400, { field: 'cmd' });
  }
  const opts: ExecOptions = {};
  for (const k of ['cwd', 'env', 'timeoutMs', 'maxOutputBytes', 'rolloutId', 'step'] as const) if (b[k] !== undefined) (opts as Record<string, unknown>)[k] = b[k];
  if (typeof b.stdin === 'string') opts.stdin = b.stdin;
  else if (typeof b.stdinBase64 === 'string') opts.stdin = Buffer.from(b.stdinBase64, 'base64');
  return { cmd, opts };
}

/** `bytes=a-b`, `bytes=a-`, `bytes=-n` of a file of `size` bytes; null for no (or an unusable) Range. */
function parseRange(h: string | undefined, size: number): { start: number; end: number } | 'unsatisfiable' | null {
  if (!h) return null;
  const m = /^bytes=(\d*)-(\d*)$/.exec(h.trim());
  if (!m || (m[1] === '' && m[2] === '')) return null;
  let start: number;
  let end: number;
  if (m[1] === '') {
    const n = Number(m[2]);
    if (n === 0) return 'unsatisfiable';
    start = Math.max(0, size - n);
    end = size - 1;
  } else {
    start = Number(m[1]);
    end = m[2] === '' ? size - 1 : Math.min(Number(m[2]), size - 1);
  }
  if (start >= size || start > end) return 'unsatisfiable';
  return { start, end };
}

/**
 * Sends what each stream's text held back (the start of a character cut off by its end or by a
 * gap: it reads as U+FFFD), so that no byte goes unsaid.
 */
async function endText(sse: SseWriter, text: Record<'stdout' | 'stderr', JsonText>): Promise<void> {
  for (const k of ['stdout', 'stderr'] as const) {
    const t = text[k].end();
    if (t) await sse.text(k, t);
  }
}

/** A Server-Sent Events stream, counted against its caller's bound and ended when the peer goes. */
async function stream(o: GatewayContext, req: Req, reply: FastifyReply, kind: string, run: (sse: SseWriter, signal: AbortSignal) => Promise<void>): Promise<void> {
  const n = o.streams.get(req.caller) ?? 0;
  if (n >= o.maxStreams) throw new GatewayError('BUSY', `${n} streams are open for this key (at most ${o.maxStreams}): close one, or retry later`, 429, { retryAfterMs: 1000 });
  o.streams.set(req.caller, n + 1);
  const ac = new AbortController();
  const raw = reply.raw;
  // The peer hanging up is the cancel: the exec is killed, the subscription dropped.
  const onClose = () => ac.abort();
  raw.once('close', onClose);
  reply.hijack();
  raw.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', connection: 'keep-alive', 'x-accel-buffering': 'no' });
  const sse = new SseWriter(raw, ac.signal);
  o.metrics.streams.inc({ kind });
  try {
    await run(sse, ac.signal);
  } catch (err) {
    if (!ac.signal.aborted) await sse.event('error', httpError(err).body).catch(() => {});
  } finally {
    o.metrics.streams.dec({ kind });
    raw.off('close', onClose);
    const left = (o.streams.get(req.caller) ?? 1) - 1;
    if (left > 0) o.streams.set(req.caller, left);
    else o.streams.delete(req.caller);
    raw.end();
  }
}

interface GatewayContext {
  pdk: Paddock;
  streams: Map<string, number>;
  maxStreams: number;
  eventsBacklog: number;
  metrics: GatewayMetrics;
}

/**
 * A handle on a sandbox without asking for its record first: one round trip per call, as with an
 * SDK handle. A sandbox that is gone answers NOT_FOUND through the directory.
 */
function sandbox(pdk: Paddock, id: string | undefined): Sandbox {
  return pdk.sandboxes.handle({ id: token(id, 'sandbox id'), state: 'running' } as SandboxInfo);
}

type Handler = (req: Req, reply: FastifyReply) => Promise<unknown>;

/** Hop-by-hop headers and the caller's key stay here; everything else goes to the server inside. */
const NOT_FORWARDED = new Set(['authorization', 'connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade', 'te', 'trailer', 'host']);

/**
 * One HTTP request to a port inside a sandbox, over a connection the node makes in its network
 * namespace (sb.ports.connect): the gateway needs no route to the node's loopback, only NATS.
 */
async function proxyPort(pdk: Paddock, req: Req, reply: FastifyReply): Promise<void> {
  const sb = sandbox(pdk, req.params.id);
  const port = Number(req.params.port);
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new GatewayError('INVALID_REQUEST', `port: must be an integer from 1 to 65535, not ${req.params.port}`);
  const rest = (req.params as Record<string, string | undefined>)['*'] ?? '';
  const q = req.url.indexOf('?');
  const conn = await sb.ports.connect(port);
  const headers: Record<string, string | string[]> = {};
  for (const [k, v] of Object.entries(req.headers)) if (v !== undefined && !NOT_FORWARDED.has(k)) headers[k] = v;
  headers.host = `127.0.0.1:${port}`;
  reply.hijack();
  const raw = reply.raw;
  await new Promise<void>((resolve) => {
    const up = httpRequest({ method: req.method, path: `/${rest}${q >= 0 ? req.url.slice(q) : ''}`, headers, createConnection: () => conn as never }, (res) => {
      raw.writeHead(res.statusCode ?? 502, res.headers);
      res.pipe(raw);
      res.once('end', resolve);
    });
    up.on('error', (err) => {
      if (!raw.headersSent) {
        raw.writeHead(502, { 'content-type': 'application/json' });
        raw.end(JSON.stringify({ code: 'BACKEND_FAILED', message: `port ${port} of sandbox ${sb.id}: ${err.message}`, retryable: true }));
      } else raw.destroy();
      resolve();
    });
    raw.once('close', () => {
      conn.destroy();
      resolve();
    });
    const body = req.body;
    if (body instanceof Readable) body.pipe(up);
    else up.end();
  });
}

/** The handler of each route in routes.ts, by its operationId. */
function handlers(o: GatewayContext): Record<string, Handler> {
  const { pdk } = o;
  const maxPayload = connectionOf(pdk).info?.max_payload ?? 1024 * 1024;
  // Room for the rest of the request (path, msgpack framing) beside a chunk of file bytes.
  const writeChunk = Math.max(64 * 1024, Math.min(Limits.files.chunkMax, maxPayload - 64 * 1024));
  const lifecycle = (verb: 'pause' | 'resume' | 'hibernate' | 'restore'): Handler => (req) => sandbox(pdk, req.params.id)[verb]();
  const proc = (req: Req) => sandbox(pdk, req.params.id).processes.get(token(req.params.pid, 'process id'));
  return {
    createSandbox: async (req, reply) => {
      const spec = object(req.body, 'sandbox spec') as CreateSpec;
      const sb = await pdk.sandboxes.create(spec);
      reply.code(201);
      return sb.info;
    },
    listSandboxes: async (req) => {
      const q = req.query;
      const states = list(q, 'state');
      for (const s of states) if (!(SandboxStates as readonly string[]).includes(s)) throw new GatewayError('INVALID_REQUEST', `state: unknown state ${JSON.stringify(s)}; known: ${SandboxStates.join(', ')}`);
      const opts: ListOptions = {};
      const l = labels(q);
      if (l) opts.labels = l;
      const group = str(q, 'group');
      if (group !== undefined) opts.group = token(group, 'group');
      if (states.length > 0) opts.state = states as ListOptions['state'];
      const node = str(q, 'node');
      if (node !== undefined) opts.node = token(node, 'node');
      const backend = str(q, 'backend');
      if (backend !== undefined) opts.backend = backend as ListOptions['backend'];
      if (flag(q, 'all')) opts.all = true;
      return { sandboxes: await pdk.sandboxes.list(opts) };
    },
    getSandbox: async (req) => (await pdk.sandboxes.get(token(req.params.id, 'sandbox id'))).info,
    killSandbox: (req) => sandbox(pdk, req.params.id).kill(),
    execSandbox: async (req, reply) => {
      const { cmd, opts } = execArgs(req.body);
      const sb = sandbox(pdk, req.params.id);
      o.metrics.execs.inc({ mode: (req.headers.accept ?? '').includes('text/event-stream') ? 'stream' : 'json' });
      if (!(req.headers.accept ?? '').includes('text/event-stream')) return sb.exec(cmd, opts);
      const base64 = str(req.query, 'encoding') === 'base64';
      await stream(o, req, reply, 'exec', async (sse, signal) => {
        const text = { stdout: new JsonText(), stderr: new JsonText() };
        for await (const ev of sb.execStream(cmd, { ...opts, signal })) {
          if (ev.type === 'exit' || ev.type === 'gap') await endText(sse, text);
          if (ev.type === 'exit') {
            const { type: _, ...rest } = ev;
            await sse.event('exit', rest);
            return;
          }
          if (ev.type === 'gap') {
            // Output lost for good during a NATS outage: said, never silent.
            await sse.event('gap', { events: ev.events, bytes: ev.bytes });
            continue;
          }
          for (const [d] of slices(ev.data)) {
            if (base64) await sse.event(ev.type, { data: d.toString('base64') });
            else await sse.text(ev.type, text[ev.type].next(d));
          }
        }
      });
      return reply;
    },
    startProcess: async (req, reply) => {
      const b = object(req.body, 'process');
      const { cmd, pty, cwd, env, timeoutMs, maxOutputBytes, bufferBytes, tag } = b as Record<string, never>;
      const sb = sandbox(pdk, req.params.id);
      const opts = { ...(cwd !== undefined ? { cwd } : {}), ...(env !== undefined ? { env } : {}), ...(timeoutMs !== undefined ? { timeoutMs } : {}), ...(maxOutputBytes !== undefined ? { maxOutputBytes } : {}), ...(bufferBytes !== undefined ? { bufferBytes } : {}), ...(tag !== undefined ? { tag } : {}) };
      const p = pty !== undefined ? await sb.pty.create({ ...opts, ...(pty as object), ...(cmd !== undefined ? { cmd } : {}) }) : await sb.processes.start(cmd ?? [], opts);
      reply.code(201);
      return p.info;
    },
    listProcesses: async (req) => ({ processes: await sandbox(pdk, req.params.id).processes.list() }),
    getProcess: async (req) => (await proc(req)).info,
    waitProcess: async (req) => {
      const p = await proc(req);
      return sandbox(pdk, req.params.id).call('process.wait', { id: p.id, waitMs: 20_000 }, { timeoutMs: 30_000 });
    },
    killProcess: async (req) => (await proc(req)).kill(str(req.query, 'signal') ?? 'SIGKILL'),
    processInput: async (req) => {
      const b = object(req.body, 'input');
      const p = await proc(req);
      const data = typeof b.data === 'string' ? Buffer.from(b.data, 'base64') : typeof b.text === 'string' ? Buffer.from(b.text) : undefined;
      if (data) await p.write(data);
      if (b.eof === true) await p.closeStdin();
      return {};
    },
    resizeProcess: async (req) => {
      const b = object(req.body, 'resize');
      await sandbox(pdk, req.params.id).call('process.resize', { id: token(req.params.pid, 'process id'), cols: b.cols, rows: b.rows });
      return {};
    },
    processOutput: async (req, reply) => {
      const p = await proc(req);
      const q = req.query;
      const offset = (k: string) => {
        const v = str(q, k);
        if (v === undefined) return 0;
        const n = Number(v);
        if (!Number.isSafeInteger(n) || n < 0) throw new GatewayError('INVALID_REQUEST', `${k}: must be a byte offset (an integer from 0)`);
        return n;
      };
      const from = { stdout: offset('stdout'), stderr: offset('stderr') };
      const follow = str(q, 'follow') !== '0' && str(q, 'follow') !== 'false';
      const holdArg = str(q, 'hold');
      if (holdArg !== undefined && !['0', '1', 'true', 'false'].includes(holdArg)) throw new GatewayError('INVALID_REQUEST', 'hold: must be 1 or 0');
      const hold = holdArg === '1' || holdArg === 'true';
      const base64 = str(q, 'encoding') === 'base64';
      await stream(o, req, reply, 'process', async (sse, signal) => {
        const text = { stdout: new JsonText(), stderr: new JsonText() };
        // Holding, the SSE writes' wait for the socket to drain is what paces the process.
        for await (const ev of p.output({ from, follow, hold, signal })) {
          if (ev.type === 'exit' || ev.type === 'gap') await endText(sse, text);
          if (ev.type === 'exit') {
            const { type: _, ...rest } = ev;
            await sse.event('exit', rest);
            return;
          }
          if (ev.type === 'gap') {
            await sse.event('gap', { stream: ev.stream, offset: ev.offset, bytes: ev.bytes });
            continue;
          }
          for (const [d, at] of slices(ev.data)) {
            if (base64) await sse.event(ev.type, { data: d.toString('base64'), offset: ev.offset + at });
            else await sse.text(ev.type, text[ev.type].next(d), ev.offset + at);
          }
        }
        await endText(sse, text);
        if (!follow) await sse.event('end', {});
      });
      return reply;
    },
    pauseSandbox: lifecycle('pause'),
    resumeSandbox: lifecycle('resume'),
    hibernateSandbox: lifecycle('hibernate'),
    restoreSandbox: lifecycle('restore'),
    setNetwork: async (req) => {
      const b = object(req.body, 'network');
      return { policy: await sandbox(pdk, req.params.id).network.set((b.policy ?? b) as never) };
    },
    sandboxStats: (req) => sandbox(pdk, req.params.id).stats(),
    snapshotSandbox: async (req, reply) => {
      const snap = await sandbox(pdk, req.params.id).snapshot();
      reply.code(201);
      return snap;
    },
    forkSandbox: async (req, reply) => {
      const b = req.body === undefined || req.body === null ? {} : object(req.body, 'fork');
      const { count, labels, group, ttlSec } = b as { count?: unknown; labels?: Record<string, string>; group?: string; ttlSec?: number };
      if (count !== undefined && typeof count !== 'number') throw new GatewayError('INVALID_REQUEST', 'count: must be an integer from 1 to 64');
      const copies = await sandbox(pdk, req.params.id).fork(count ?? 1, { ...(labels !== undefined ? { labels } : {}), ...(group !== undefined ? { group } : {}), ...(ttlSec !== undefined ? { ttlSec } : {}) });
      reply.code(201);
      return { sandboxes: copies.map((c) => c.info) };
    },
    listSnapshots: async (req) => {
      const node = str(req.query, 'node');
      const from = str(req.query, 'from');
      return { snapshots: await pdk.snapshots.list({ ...(node !== undefined ? { node: token(node, 'node') } : {}), ...(from !== undefined ? { from: token(from, 'from') } : {}) }) };
    },
    portGet: (req, reply) => proxyPort(pdk, req, reply),
    portPost: (req, reply) => proxyPort(pdk, req, reply),
    portPut: (req, reply) => proxyPort(pdk, req, reply),
    portDelete: (req, reply) => proxyPort(pdk, req, reply),
    deleteSnapshot: async (req) => ({ deleted: await pdk.snapshots.delete(token(req.params.id, 'snapshot id')) }),
    screenshot: async (req, reply) => {
      const s = await sandbox(pdk, req.params.id).display.screenshot();
      return reply.type('image/png').header('x-screen-size', `${s.width}x${s.height}`).send(Buffer.from(s.png));
    },
    displayView: async (req) => {
      const control = ['1', 'true'].includes(str(req.query, 'control') ?? '');
      return { url: await sandbox(pdk, req.params.id).display.viewUrl({ control }), control };
    },
    computerAction: async (req) => {
      const r = await sandbox(pdk, req.params.id).computer(object(req.body, 'computer') as never);
      return r.screenshot ? { cursor: r.cursor, screenshot: { ...r.screenshot, png: Buffer.from(r.screenshot.png).toString('base64') } } : { cursor: r.cursor };
    },
    readFile: async (req, reply) => {
      const sb = sandbox(pdk, req.params.id);
      const p = path(req.query);
      o.metrics.files.inc({ op: 'read' });
      type Read = { data: Uint8Array; size: number; eof: boolean };
      const read = (offset: number, length: number) => sb.call<Read>('files.read', { path: p, offset, length });
      let first = await read(0, Limits.files.chunkMax);
      const size = first.size;
      const range = parseRange(req.headers.range, size);
      if (range === 'unsatisfiable') {
        reply.header('content-range', `bytes */${size}`);
        throw new GatewayError('INVALID_REQUEST', `range ${req.headers.range} is outside the file (${size} bytes)`, 416);
      }
      const start = range?.start ?? 0;
      const end = range?.end ?? size - 1;
      if (start !== 0) first = await read(start, Math.min(Limits.files.chunkMax, end - start + 1));
      reply.header('accept-ranges', 'bytes').type('application/octet-stream');
      if (range) reply.code(206).header('content-range', `bytes ${start}-${end}/${size}`);
      // A file that grows while it is read is sent as it was when the first chunk came.
      reply.header('content-length', String(Math.max(0, end - start + 1)));
      async function* chunks(): AsyncGenerator<Uint8Array> {
        let r = first;
        let offset = start;
        for (;;) {
          const take = r.data.subarray(0, Math.max(0, end + 1 - offset));
          if (take.length > 0) yield take;
          offset += take.length;
          if (offset > end || r.eof || r.data.length === 0) return;
          r = await read(offset, Math.min(Limits.files.chunkMax, end + 1 - offset));
        }
      }
      return reply.send(Readable.from(chunks(), { objectMode: false }));
    },
    uploadTar: async (req) => {
      const p = path(req.query);
      o.metrics.files.inc({ op: 'upload' });
      const body = req.body instanceof Readable ? req.body : Readable.from([]);
      const r = await sandbox(pdk, req.params.id).files.upload(body, p);
      return { path: p, entries: r.entries, bytes: r.bytes };
    },
    downloadTar: async (req, reply) => {
      const p = path(req.query);
      o.metrics.files.inc({ op: 'download' });
      const tar = sandbox(pdk, req.params.id).files.download(p);
      // The first chunk decides the status: an unknown path is a 404, not a 200 that breaks off.
      const it = tar[Symbol.asyncIterator]();
      const first = await it.next();
      async function* rest() {
        if (!first.done) yield first.value as Buffer;
        for (let r = await it.next(); !r.done; r = await it.next()) yield r.value as Buffer;
      }
      return reply.type('application/x-tar').send(Readable.from(rest(), { objectMode: false }));
    },
    listFiles: async (req) => ({ entries: await sandbox(pdk, req.params.id).files.list(path(req.query)) }),
    writeFile: async (req) => {
      const sb = sandbox(pdk, req.params.id);
      const p = path(req.query);
      o.metrics.files.inc({ op: 'write' });
      const mode = num(req.query, 'mode');
      const body = req.body instanceof Readable ? req.body : Readable.from(req.body === undefined ? [] : [Buffer.from(typeof req.body === 'string' ? req.body : JSON.stringify(req.body))]);
      // The body is read a chunk at a time and each chunk written before the next is read: memory
      // stays at one chunk whatever the file's size (the sandbox's disk limit is the only bound).
      let pending: Buffer[] = [];
      let pendingBytes = 0;
      let offset = 0;
      const flush = async (last: boolean) => {
        while (pendingBytes >= writeChunk || (last && (pendingBytes > 0 || offset === 0))) {
          const all = Buffer.concat(pending);
          const data = all.subarray(0, writeChunk);
          await sb.call('files.write', { path: p, data, ...(offset === 0 ? (mode !== undefined ? { mode } : {}) : { offset }) });
          offset += data.length;
          const rest = all.subarray(data.length);
          pending = rest.length > 0 ? [rest] : [];
          pendingBytes = rest.length;
          if (last && pendingBytes === 0) break;
        }
      };
      for await (const c of body) {
        pending.push(c as Buffer);
        pendingBytes += (c as Buffer).length;
        if (pendingBytes >= writeChunk) await flush(false);
      }
      await flush(true);
      return { path: p, size: offset };
    },
    removeFile: async (req, reply) => {
      await sandbox(pdk, req.params.id).files.remove(path(req.query), { recursive: flag(req.query, 'recursive') });
      o.metrics.files.inc({ op: 'remove' });
      return reply.code(204).send();
    },
    groupVerb: async (req) => {
      const verb = req.params.verb as (typeof GroupVerbs)[number];
      if (!(GroupVerbs as readonly string[]).includes(verb)) throw new GatewayError('UNKNOWN_VERB', `unknown group verb ${JSON.stringify(verb)}; known: ${GroupVerbs.join(', ')}`);
      return pdk.groups[verb](token(req.params.group, 'group'));
    },
    startRollout: async (req, reply) => {
      const b = object(req.body, 'rollout');
      const ro = await pdk.rollouts.start(b as never);
      reply.code(201);
      return { rollout: ro.record, sandbox: ro.sandbox.info, lastStep: ro.lastStep };
    },
    getRollout: async (req) => {
      const r = await pdk.rollouts.get(token(req.params.rolloutId, 'rolloutId'));
      if (!r) throw new GatewayError('NOT_FOUND', `rollout ${req.params.rolloutId} does not exist`);
      return r;
    },
    attachRollout: async (req) => {
      const ro = await pdk.rollouts.attach(token(req.params.rolloutId, 'rolloutId'), { prefetch: false });
      return { rollout: ro.record, sandbox: ro.sandbox.info, lastStep: ro.lastStep };
    },
    exportRollout: async (req, reply) => {
      const id = token(req.params.rolloutId, 'rolloutId');
      const lines = pdk.rollouts.export(id);
      // The first page comes before the status line, so an unknown rollout is a 404, not a cut body.
      const first = await lines.next();
      async function* body(): AsyncGenerator<string> {
        if (first.done) return;
        yield `${first.value}\n`;
        for await (const l of lines) yield `${l}\n`;
      }
      return reply.type('application/x-ndjson').send(Readable.from(body()));
    },
    deleteRollout: async (req, reply) => {
      await pdk.rollouts.delete(token(req.params.rolloutId, 'rolloutId'), { kill: flag(req.query, 'kill') });
      return reply.code(204).send();
    },
    fnInvoke: async (req) => pdk.fn.invoke(object(req.body, 'invocation') as never, { retryBusy: flag(req.query, 'retryBusy') }),
    listNodes: async () => ({ nodes: await pdk.nodes.list() }),
    getNode: (req) => pdk.nodes.info(token(req.params.node, 'node')),
    events: async (req, reply) => {
      const q = req.query;
      const id = str(q, 'id');
      const group = str(q, 'group');
      const node = str(q, 'node');
      const states = new Set(list(q, 'state'));
      const l = labels(q) ?? {};
      const nc = connectionOf(pdk);
      // Subscribed at the server before the response starts: a client that acts once it has the
      // headers (creates a sandbox, say) must see every event that follows.
      const backlog = new Backlog<Uint8Array>(o.eventsBacklog);
      const sub = nc.subscribe(subjects.events(id === undefined ? '*' : token(id, 'id')), { callback: (_err, m) => backlog.push(m.data) });
      try {
        await nc.flush();
      } catch (err) {
        sub.unsubscribe();
        throw err;
      }
      // A stream refused (too many open) still drops the subscription: the finally below.
      await stream(o, req, reply, 'events', async (sse, signal) => {
        const stop = () => {
          sub.unsubscribe();
          backlog.close();
        };
        signal.addEventListener('abort', stop, { once: true });
        // Comments keep proxies and idle timers from closing a quiet stream.
        const ping = setInterval(() => void sse.comment('ping').catch(() => {}), 15_000);
        await sse.comment('subscribed');
        try {
          for (;;) {
            const next = await backlog.take();
            if (next === undefined) return;
            if ('dropped' in next) {
              // Events the reader was too slow for: said, never silent; records can be read again.
              await sse.event('gap', { events: next.dropped });
              continue;
            }
            let rec: SandboxInfo;
            try {
              rec = decode(next.item) as SandboxInfo;
            } catch {
              continue;
            }
            if (group !== undefined && rec.group !== group) continue;
            if (node !== undefined && rec.node !== node) continue;
            if (states.size > 0 && !states.has(rec.state)) continue;
            if (Object.entries(l).some(([k, v]) => rec.labels?.[k] !== v)) continue;
            await sse.event('sandbox', rec);
          }
        } finally {
          clearInterval(ping);
          stop();
        }
      }).finally(() => sub.unsubscribe());
      return reply;
    },
    openapi: async () => openApiDocument(),
    metrics: async (_req, reply) => reply.type(o.metrics.registry.contentType).send(await o.metrics.registry.metrics()),
    health: async () => ({ ok: true }),
  };
}

export interface Gateway {
  app: FastifyInstance;
  /** The routes as registered (method and URL template), for the OpenAPI test. */
  registered: Array<{ method: string; url: string }>;
}

export function buildGateway(opts: GatewayOptions): Gateway {
  const metrics = opts.metrics ?? gatewayMetrics();
  const ctx: GatewayContext = { pdk: opts.pdk, streams: new Map(), maxStreams: opts.maxStreamsPerKey ?? 32, eventsBacklog: opts.eventsBacklog ?? 10_000, metrics };
  const maxHeaderSize = opts.maxHeaderSize ?? 16 * 1024;
  const app = Fastify({
    // Bounded heads and JSON bodies; file bodies (PUT .../files) stream past bodyLimit, see below.
    bodyLimit: opts.bodyLimit ?? Limits.requestBytesMax,
    serverFactory: (handler) => createServer({ maxHeaderSize, keepAliveTimeout: 65_000 }, handler as (req: IncomingMessage, res: ServerResponse) => void) as Server,
    logger: false,
    return503OnClosing: true,
  });
  const registered: Gateway['registered'] = [];
  app.addHook('onRoute', (r: RouteOptions) => {
    for (const m of Array.isArray(r.method) ? r.method : [r.method]) if (m !== 'HEAD') registered.push({ method: m, url: r.url });
  });
  app.decorateRequest('caller', '');
  app.setErrorHandler((err, _req, reply) => {
    metrics.errors.inc({ code: httpError(err).body.code });
    return sendError(reply, err);
  });
  app.setNotFoundHandler((req, reply) => sendError(reply, new GatewayError('NOT_FOUND', `no route ${req.method} ${req.url.split('?')[0]}`)));
  app.addHook('onResponse', (req, reply, done) => {
    const route = req.routeOptions.url ?? 'unmatched';
    metrics.requests.inc({ method: req.method, route, status: String(reply.statusCode) });
    metrics.duration.observe({ method: req.method, route }, reply.elapsedTime / 1000);
    done();
  });

  const h = handlers(ctx);
  const add = (scope: FastifyInstance, r: Route) => {
    const handler = h[r.operationId];
    if (!handler) throw new Error(`route ${r.operationId} has no handler`);
    scope.route({
      method: r.method,
      // `{rest}` at the end is the rest of the path, slashes and all: fastify's wildcard.
      url: r.path.replace(/\{rest\}$/, '*').replace(/\{(\w+)\}/g, ':$1'),
      ...(r.public
        ? {}
        : {
            onRequest: async (req: FastifyRequest) => {
              req.caller = authenticate(opts.keys, req.headers.authorization, req.socket.remoteAddress);
            },
          }),
      handler: handler as never,
    });
  };
  for (const r of Routes) if (!r.rawBody) add(app, r);
  // File bodies are bytes of any type and any size: this scope hands the handler the request
  // stream instead of parsing it.
  app.register((raw, _opts, done) => {
    raw.removeAllContentTypeParsers();
    raw.addContentTypeParser('*', { bodyLimit: Number.MAX_SAFE_INTEGER }, (_req, payload, next) => next(null, payload));
    for (const r of Routes) if (r.rawBody) add(raw, r);
    done();
  });
  serveDashboard(app);
  return { app, registered };
}

/**
 * A node's Prometheus metrics (prom-client) at `/metrics` on its own loopback port
 * (PADDOCK_METRICS_PORT, default a free one; the URL is logged and written to
 * `<nodeDir>/metrics.url`).
 *
 * Everything is observed from outside the actors, so nothing in actors/ knows about metrics:
 * - request counts and latencies from the spans every handled request already is (actors/bind.ts),
 *   through a span processor — so the node registers a tracer provider even with no exporter;
 * - capacity and use from the node's own heartbeat record (KV `pdk_nodes`);
 * - sandboxes by state from the lifecycle events the node publishes.
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import { join } from 'node:path';
import type { KV } from '@nats-io/kv';
import type { NatsConnection, Subscription } from '@nats-io/transport-node';
import type { ReadableSpan, SpanProcessor } from '@opentelemetry/sdk-trace-base';
import type { Logger } from 'pino';
import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from 'prom-client';
import { decode, type NodeRecord, type SandboxInfo, subjects } from '../protocol/index.ts';

export const registry = new Registry();
collectDefaultMetrics({ register: registry, prefix: 'paddock_node_' });
const registers = [registry];

/** Seconds: an exec of `true` (~2 ms) to a create that waits for an image build (~2 min). */
const BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120];

// Label values come from closed sets (verbs, error codes, states, backend kinds): no sandbox ids.
const requests = new Counter({ name: 'paddock_requests_total', help: 'Requests a node handled, by operation and result code (OK or the error code)', labelNames: ['op', 'code'], registers });
const errors = new Counter({ name: 'paddock_errors_total', help: 'Requests a node refused or failed, by operation and error code', labelNames: ['op', 'code'], registers });
const creates = new Counter({ name: 'paddock_creates_total', help: 'Sandbox creates on this node, by result code', labelNames: ['code'], registers });
const execs = new Counter({ name: 'paddock_execs_total', help: 'Execs asked of sandboxes on this node, by result code', labelNames: ['code'], registers });
const fileCalls = new Counter({ name: 'paddock_file_calls_total', help: 'File calls on sandboxes of this node, by verb and result code', labelNames: ['op', 'code'], registers });
const createSeconds = new Histogram({ name: 'paddock_create_duration_seconds', help: 'Time for a node to admit and start a sandbox', buckets: BUCKETS, registers });
const placementSeconds = new Histogram({ name: 'paddock_placement_duration_seconds', help: 'Time for a placement replica to place a create (node create included)', buckets: BUCKETS, registers });
const execSeconds = new Histogram({ name: 'paddock_exec_duration_seconds', help: 'Time to answer a non-streamed exec (a streamed one is counted, its span ends when the stream starts)', buckets: BUCKETS, registers });
const fnSeconds = new Histogram({ name: 'paddock_fn_invoke_duration_seconds', help: 'Time to answer a FnCall invocation', labelNames: ['code'], buckets: BUCKETS, registers });
const groupCalls = new Counter({ name: 'paddock_group_calls_total', help: 'Group verbs handled by this node', labelNames: ['code'], registers });

const FILE_VERBS = new Set(['files.read', 'files.write', 'files.list', 'files.remove']);

function observe(span: ReadableSpan): void {
  const seconds = span.duration[0] + span.duration[1] / 1e9;
  const code = String(span.attributes['paddock.error.code'] ?? 'OK');
  // Request spans say their operation (`exec`, `node.create`, …) in the messaging conventions'
  // attribute; transitions and streams (operation type `send`) are not requests.
  if (span.attributes['messaging.operation.type'] !== 'process') return;
  const op = String(span.attributes['messaging.operation.name'] ?? '');
  if (!op) return;
  requests.inc({ op, code });
  if (code !== 'OK') errors.inc({ op, code });
  if (op === 'node.create') {
    creates.inc({ code });
    if (code === 'OK') createSeconds.observe(seconds);
  } else if (op === 'place.create') {
    if (code === 'OK') placementSeconds.observe(seconds);
  } else if (op === 'exec') {
    execs.inc({ code });
    execSeconds.observe(seconds);
  } else if (FILE_VERBS.has(op)) fileCalls.inc({ op, code });
  else if (op === 'fn.invoke') fnSeconds.observe({ code }, seconds);
  else if (op === 'node.group') groupCalls.inc({ code });
}

/** Hands the end of every request span to the counters and histograms above. */
export function metricsSpanProcessor(): SpanProcessor {
  return {
    onStart: () => {},
    onEnd: (span) => observe(span),
    forceFlush: async () => {},
    shutdown: async () => {},
  };
}

const MiB = 1024 * 1024;
const capacity = {
  cpu: new Gauge({ name: 'paddock_node_cpu_capacity_cores', help: 'CPU cores the node offers (overcommit included), per backend kind', labelNames: ['backend'], registers }),
  memory: new Gauge({ name: 'paddock_node_memory_capacity_bytes', help: 'Memory the node offers (overcommit included), per backend kind', labelNames: ['backend'], registers }),
  sandboxes: new Gauge({ name: 'paddock_node_sandbox_capacity', help: 'Sandboxes the node admits at most, per backend kind', labelNames: ['backend'], registers }),
};
const allocated = {
  cpu: new Gauge({ name: 'paddock_node_cpu_allocated_cores', help: 'CPU cores held by admitted sandboxes, per backend kind', labelNames: ['backend'], registers }),
  memory: new Gauge({ name: 'paddock_node_memory_allocated_bytes', help: 'Memory held by admitted sandboxes, per backend kind', labelNames: ['backend'], registers }),
  sandboxes: new Gauge({ name: 'paddock_node_sandboxes_allocated', help: 'Sandboxes admitted, per backend kind', labelNames: ['backend'], registers }),
};
const draining = new Gauge({ name: 'paddock_node_draining', help: '1 while the node takes no new sandboxes', registers });
const fnQueue = new Gauge({ name: 'paddock_fn_queue_depth', help: 'FnCall invocations waiting for a warm sandbox on this node', registers });
const fnRunning = new Gauge({ name: 'paddock_fn_running', help: 'FnCall invocations running on this node', registers });
const ended = new Counter({ name: 'paddock_sandboxes_ended_total', help: 'Sandboxes of this node that stopped or failed, by reason', labelNames: ['reason'], registers });

function record(r: NodeRecord): void {
  const offers = r.offers && Object.keys(r.offers).length > 0 ? r.offers : { [r.backends[0] ?? 'container']: { capacity: r.capacity, allocated: r.allocated } };
  for (const [backend, o] of Object.entries(offers)) {
    if (!o) continue;
    capacity.cpu.set({ backend }, o.capacity.cpu);
    capacity.memory.set({ backend }, o.capacity.memoryMiB * MiB);
    capacity.sandboxes.set({ backend }, o.capacity.sandboxes);
    allocated.cpu.set({ backend }, o.allocated.cpu);
    allocated.memory.set({ backend }, o.allocated.memoryMiB * MiB);
    allocated.sandboxes.set({ backend }, o.allocated.sandboxes);
  }
  draining.set(r.state === 'draining' ? 1 : 0);
  fnQueue.set(r.fn?.queued ?? 0);
  fnRunning.set(r.fn?.running ?? 0);
}

export interface NodeMetrics {
  url: string;
  close(): Promise<void>;
}

/** Watches the node's record and events, and serves `/metrics`. */
export async function startNodeMetrics(o: { nc: NatsConnection; nodes: KV; nodeId: string; nodeDir: string; log: Logger; port?: number }): Promise<NodeMetrics> {
  const states = new Map<string, { state: string; backend: string }>();
  new Gauge({
    name: 'paddock_sandboxes',
    help: 'Sandboxes of this node, by state and backend kind',
    labelNames: ['state', 'backend'],
    registers,
    collect() {
      this.reset();
      for (const s of states.values()) this.inc({ state: s.state, backend: s.backend });
    },
  });
  const sub: Subscription = o.nc.subscribe(subjects.events('*'), {
    callback: (_err, m) => {
      let rec: SandboxInfo;
      try {
        rec = decode(m.data) as SandboxInfo;
      } catch {
        return;
      }
      if (rec.node !== o.nodeId) return;
      if (rec.state === 'stopped' || rec.state === 'failed') {
        if (states.delete(rec.id)) ended.inc({ reason: rec.reason ?? rec.state });
      } else states.set(rec.id, { state: rec.state, backend: rec.backend });
    },
  });
  const watch = await o.nodes.watch({ key: o.nodeId });
  void (async () => {
    for await (const e of watch) {
      if (e.operation !== 'PUT') continue;
      try {
        record(decode(e.value) as NodeRecord);
      } catch (err) {
        o.log.warn({ err }, 'metrics: unreadable node record');
      }
    }
  })();
  const server: Server = createServer((req, res) => {
    if (req.url !== '/metrics') {
      res.writeHead(404).end();
      return;
    }
    registry.metrics().then(
      (text) => res.writeHead(200, { 'content-type': registry.contentType }).end(text),
      (err: unknown) => res.writeHead(500).end(String(err)),
    );
  });
  const port = o.port ?? Number(process.env.PADDOCK_METRICS_PORT ?? 0);
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, process.env.PADDOCK_METRICS_HOST ?? '127.0.0.1', () => resolve());
  });
  const a = server.address();
  const url = `http://${typeof a === 'object' && a ? `${a.address}:${a.port}` : `127.0.0.1:${port}`}/metrics`;
  await mkdir(o.nodeDir, { recursive: true });
  await writeFile(join(o.nodeDir, 'metrics.url'), `${url}\n`);
  o.log.info({ url }, 'metrics served');
  return {
    url,
    close: async () => {
      sub.unsubscribe();
      watch.stop();
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

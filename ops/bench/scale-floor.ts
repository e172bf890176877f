/**
 * The floor of the scale benchmark: what a create and a group pause cost NATS when nothing but
 * NATS does the work, on the same cluster, with the same processes and the same creates in flight.
 * scale.ts forks this file in two roles:
 *
 * - `fleet <first> <count> <nodes> <placement>`: `count` node responders and
 *   `placement` placement responders in one process. A placement responder forwards a create to
 *   a node chosen at random; the node records the sandbox in a replicated KV bucket (a create where
 *   nothing is, as a sandbox's first directory write is), subscribes the sandbox's subject (a
 *   sandbox is addressed by its own) and answers. A group request writes every record of the node
 *   again, all at once (what a group pause writes to the directory).
 * - `trainer`: creates through the placement queue group at a fixed number in flight, as
 *   scale-trainer.ts does through the SDK.
 *
 * No admission, actors, events, logging or backend: Paddock's own work is what the ratio to this
 * floor measures.
 */
import { performance } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';
import { jetstreamManager } from '@nats-io/jetstream';
import { Kvm } from '@nats-io/kv';
import { connect, type NatsConnection, type Subscription } from '@nats-io/transport-node';
import { encode } from '../../protocol/index.ts';
import type { BurstResult } from './scale-trainer.ts';

export const FLOOR_BUCKET = 'paddock_bench_floor';
export const floorNodeSubject = (n: number, verb: 'create' | 'group') => `bench.floor.node.${n}.${verb}`;
const PLACE = 'bench.floor.place';

export type FloorCommand = { cmd: 'burst'; seq: number; count: number; concurrency: number } | { cmd: 'exit' };

/** A record the size of a sandbox's (a SandboxInfo, MessagePack). */
function record(id: string, node: number, state: string): Uint8Array {
  return encode({ id, node: `node-${node}`, state, backend: 'sim', image: 'busybox', group: 'job-0', labels: { job: 'job-0' }, createdAt: Date.now(), spec: { backend: 'sim', image: 'busybox', memoryMiB: 512, cpu: 1, diskMiB: 1024, group: 'job-0' } });
}

async function fleet(nc: NatsConnection, first: number, count: number, nodes: number, placement: number): Promise<void> {
  const kv = await new Kvm(nc).open(FLOOR_BUCKET);
  const enc = new TextEncoder();
  const dec = new TextDecoder();
  for (let n = first; n < first + count; n++) {
    const held = new Map<string, Subscription>();
    nc.subscribe(floorNodeSubject(n, 'create'), {
      callback: (_err, m) => {
        const id = dec.decode(m.data);
        kv.create(id, record(id, n, 'running')).then(
          () => {
            held.set(id, nc.subscribe(`bench.floor.sb.${id}.>`, { callback: () => {} }));
            m.respond(enc.encode(String(n)));
          },
          (err: Error) => m.respond(enc.encode(`error ${err.message}`)),
        );
      },
    });
    nc.subscribe(floorNodeSubject(n, 'group'), {
      callback: (_err, m) => {
        Promise.all([...held.keys()].map((id) => kv.put(id, record(id, n, 'paused')))).then(
          () => m.respond(enc.encode(String(held.size))),
          (err: Error) => m.respond(enc.encode(`error ${err.message}`)),
        );
      },
    });
  }
  for (let p = 0; p < placement; p++) {
    nc.subscribe(PLACE, {
      queue: 'bench-floor',
      callback: (_err, m) => {
        const node = Math.floor(Math.random() * nodes);
        nc.request(floorNodeSubject(node, 'create'), m.data, { timeout: 60_000 }).then(
          (r) => m.respond(r.data),
          (err: Error) => m.respond(enc.encode(`error ${err.message}`)),
        );
      },
    });
  }
  await nc.flush();
}

async function trainer(nc: NatsConnection, m: Extract<FloorCommand, { cmd: 'burst' }>): Promise<BurstResult> {
  const now = () => performance.timeOrigin + performance.now();
  const r: BurstResult = { seq: m.seq, created: 0, failed: 0, errors: {}, samples: {}, latencies: [], startMs: now(), endMs: 0, nodes: {} };
  const enc = new TextEncoder();
  const dec = new TextDecoder();
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(m.count, m.concurrency) }, async () => {
      for (let i = next++; i < m.count; i = next++) {
        const t = performance.now();
        try {
          const answer = dec.decode((await nc.request(PLACE, enc.encode(`f${process.pid}x${m.seq}x${i}`), { timeout: 60_000 })).data);
          if (answer.startsWith('error')) throw new Error(answer);
          r.latencies.push(performance.now() - t);
          r.created++;
          r.nodes[answer] = (r.nodes[answer] ?? 0) + 1;
        } catch (err) {
          r.failed++;
          const k = (err as Error).message.slice(0, 80);
          r.errors[k] = (r.errors[k] ?? 0) + 1;
        }
      }
    }),
  );
  r.endMs = now();
  return r;
}

/** The floor's bucket, made by the parent before the floor's processes start. */
export async function makeFloorBucket(nc: NatsConnection, replicas: number): Promise<void> {
  await new Kvm(nc).create(FLOOR_BUCKET, { history: 1, replicas });
}

/** Removes the floor's bucket (the parent, once the floor's processes are gone). */
export async function removeFloorBucket(nc: NatsConnection): Promise<void> {
  await (await jetstreamManager(nc)).streams.delete(`KV_${FLOOR_BUCKET}`).catch(() => false);
}

async function main(): Promise<void> {
  const [role, ...args] = process.argv.slice(2);
  const nc = await connect({ servers: (process.env.NATS_URL as string).split(','), name: `bench-floor-${role}-${process.pid}` });
  const send = (m: unknown) => process.send?.(m);
  if (role === 'fleet') {
    const [first, count, nodes, placement] = args.map(Number) as [number, number, number, number];
    await fleet(nc, first, count, nodes, placement);
  } else if (role !== 'trainer') throw new Error(`scale-floor.ts: role fleet or trainer, not ${role}`);
  process.on('message', (m: FloorCommand) => {
    if (m.cmd === 'exit') void nc.close().finally(() => process.exit(0));
    else if (m.cmd === 'burst' && role === 'trainer') void trainer(nc, m).then(send);
  });
  send({ ready: true });
}

// Imported by scale.ts for its subjects and bucket; run as a forked child.
if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) await main();

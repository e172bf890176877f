/**
 * One trainer of the scale benchmark (scale.ts forks several): an SDK client that creates its
 * share of each burst at a fixed number of creates in flight, keeps a few of the sandboxes to
 * drive with execs, and reports latencies to the parent over the IPC channel. A separate process
 * per trainer, as a training job's workers are: one client's event loop would be the limit.
 */
import { performance } from 'node:perf_hooks';
import { Paddock, type Sandbox } from '../../sdk/index.ts';

export type TrainerCommand =
  | { cmd: 'burst'; seq: number; group: string; count: number; concurrency: number; keepEvery: number }
  | { cmd: 'exec'; seq: number; concurrency: number }
  | { cmd: 'exit' };

export interface BurstResult {
  seq: number;
  created: number;
  failed: number;
  errors: Record<string, number>;
  /** The first message of each error code. */
  samples: Record<string, string>;
  /** Milliseconds of each successful create, in completion order. */
  latencies: number[];
  /** performance.timeOrigin-based wall times of the first send and the last answer. */
  startMs: number;
  endMs: number;
  nodes: Record<string, number>;
}

export interface ExecResult {
  seq: number;
  ok: number;
  failed: number;
  errors: Record<string, number>;
  samples: Record<string, string>;
  latencies: number[];
  startMs: number;
  endMs: number;
}

const now = () => performance.timeOrigin + performance.now();

/** Runs `n` tasks with at most `k` in flight. */
async function pool(n: number, k: number, task: (i: number) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(n, k) }, async () => {
      for (let i = next++; i < n; i = next++) await task(i);
    }),
  );
}

async function main(): Promise<void> {
  const servers = process.env.NATS_URL as string;
  const pdk = await Paddock.connect({ servers, timeoutMs: 120_000, name: `bench-trainer-${process.pid}` });
  const kept: Sandbox[] = [];
  const send = (m: unknown) => process.send?.(m);
  process.on('message', (m: TrainerCommand) => {
    void (async () => {
      if (m.cmd === 'exit') {
        await pdk.close().catch(() => {});
        process.exit(0);
      }
      if (m.cmd === 'burst') {
        const r: BurstResult = { seq: m.seq, created: 0, failed: 0, errors: {}, samples: {}, latencies: [], startMs: now(), endMs: 0, nodes: {} };
        await pool(m.count, m.concurrency, async (i) => {
          const t = performance.now();
          try {
            const sb = await pdk.sandboxes.create({ backend: 'sim', group: m.group });
            // A create answered with a sandbox that is not running is no placement, whatever the answer says.
            if (sb.info.state !== 'running') {
              const k = `answered ${sb.info.state}${sb.info.reason ? ` (${sb.info.reason})` : ''}`;
              r.failed++;
              r.errors[k] = (r.errors[k] ?? 0) + 1;
              r.samples[k] ??= `${sb.id} on ${sb.info.node}`;
              return;
            }
            r.latencies.push(performance.now() - t);
            r.created++;
            r.nodes[sb.info.node] = (r.nodes[sb.info.node] ?? 0) + 1;
            if (m.keepEvery > 0 && i % m.keepEvery === 0) kept.push(sb);
          } catch (err) {
            r.failed++;
            const code = (err as { code?: string }).code ?? (err as Error).message.slice(0, 80);
            r.errors[code] = (r.errors[code] ?? 0) + 1;
            r.samples[code] ??= (err as Error).message.slice(0, 300);
          }
        });
        r.endMs = now();
        send(r);
      } else if (m.cmd === 'exec') {
        const r: ExecResult = { seq: m.seq, ok: 0, failed: 0, errors: {}, samples: {}, latencies: [], startMs: now(), endMs: 0 };
        await pool(kept.length, m.concurrency, async (i) => {
          const t = performance.now();
          try {
            const x = await (kept[i] as Sandbox).exec(['sh', '-c', 'echo step > /tmp/step; cat /tmp/step; pwd'], { maxOutputBytes: 4096 });
            if (x.exitCode === 0) {
              r.ok++;
              r.latencies.push(performance.now() - t);
            } else {
              r.failed++;
              r.errors[`exit ${x.exitCode}`] = (r.errors[`exit ${x.exitCode}`] ?? 0) + 1;
            }
          } catch (err) {
            r.failed++;
            const code = (err as { code?: string }).code ?? (err as Error).message.slice(0, 80);
            r.errors[code] = (r.errors[code] ?? 0) + 1;
            r.samples[code] ??= (err as Error).message.slice(0, 300);
          }
        });
        r.endMs = now();
        send(r);
      }
    })();
  });
  send({ ready: true });
}

await main();

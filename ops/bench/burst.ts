/**
 * The bridge under a burst: two sim nodes, then a burst of 3× their capacity, with the `local`
 * provider adding real node processes on this host.
 *
 *   npm run bench:burst [-- --cap 8] [-- --json]
 *
 * Reports, from the first refused admission (the first create that waits): the scale-up decision;
 * the first sandbox running on a new machine; all placed; creates failed (target 0); machines
 * added; and from the end of the burst (every sandbox killed) to all extra machines released.
 * Beside them the floor: one node started directly (startNode, to ready), what a `local` machine
 * costs at least. Targets: decision ≤ 1 s; a machine ready ≤ 5 s after the decision; 0 failed;
 * released ≤ 10 s after the idle time ends.
 * stdout carries the table and, with --json, one JSON object as its last line:
 * {"decisionMs","firstOnNewMs","allPlacedMs","failed","machinesAdded","drainedMs", …}.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { LocalProvider } from '../../bridge/providers/local/index.ts';
import { decode, subjects } from '../../protocol/index.ts';
import { connectionOf } from '../../sdk/client.ts';
import { Paddock } from '../../sdk/index.ts';
import { startBridge } from '../bridge-main.ts';
import { nodeCommand } from '../launch.ts';
import { startLocalCluster, startNode } from '../local.ts';
import { createLogger } from '../log.ts';

const args = process.argv.slice(2);
const json = args.includes('--json');
const capArg = args.indexOf('--cap');
const CAP = capArg >= 0 ? Number(args[capArg + 1]) : 8;
const IDLE_MS = 3000;
const say = (s: string) => process.stderr.write(`${s}\n`);

const home = await mkdtemp(join(tmpdir(), 'paddock-bench-burst-'));
const images = join(tmpdir(), 'paddock-test-images');
const nodeEnv = { PADDOCK_BACKENDS: 'sim', PADDOCK_SIM_SANDBOXES: String(CAP), PADDOCK_HEARTBEAT_MS: '500', PADDOCK_FN: '0', PADDOCK_FN_BUILD: '0', PADDOCK_IMAGES_DIR: images };
say('starting nats-server and two nodes');
const cluster = await startLocalCluster({ home, nodes: 2, prefix: 'burst', imagesDir: images, env: { ...nodeEnv, PADDOCK_WAIT_FOR_CAPACITY_MS: '120000' } });
const provider = new LocalProvider({ stateDir: join(home, 'bridge', 'local'), command: () => nodeCommand({ dieWithParent: false }), env: nodeEnv });
const bridge = await startBridge({
  natsUrl: cluster.url,
  provider,
  log: createLogger('bridge', 'warn'),
  env: { PADDOCK_BRIDGE_SHAPE: `cpu=64,memory=262144,sandboxes=${CAP}`, PADDOCK_BRIDGE_MAX_MACHINES: '8', PADDOCK_BRIDGE_IDLE_MS: String(IDLE_MS), PADDOCK_BRIDGE_COOLDOWN_MS: '500', PADDOCK_BRIDGE_TAG: 'bench' },
});
const pdk = await Paddock.connect({ servers: cluster.url, timeoutMs: 180_000 });
const nc = connectionOf(pdk);
let firstWait = 0;
let decision = 0;
nc.subscribe(subjects.events('*'), {
  callback: (_e, m) => {
    if (!firstWait && m.subject.endsWith('.waiting')) firstWait = performance.now();
  },
});
nc.subscribe(subjects.bridgeDecision, {
  callback: (_e, m) => {
    if (!decision && (decode(m.data) as { action: string }).action === 'scale-up') decision = performance.now();
  },
});
try {
  while (!bridge.host.leading) await sleep(100);
  await sleep(1500);
  const n = 3 * 2 * CAP;
  say(`burst of ${n} creates (fleet capacity ${2 * CAP})`);
  const fleet = new Set(cluster.nodes.map((x) => x.id));
  let firstOnNew = 0;
  const results = await Promise.allSettled(
    Array.from({ length: n }, () =>
      pdk.sandboxes.create({ backend: 'sim' }).then((sb) => {
        if (!firstOnNew && !fleet.has(sb.info.node)) firstOnNew = performance.now();
        return sb;
      }),
    ),
  );
  const allPlaced = performance.now();
  const ok = results.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
  const failed = n - ok.length;
  const machinesAdded = (await provider.list({ 'paddock-bridge': 'bench' })).length;
  await Promise.all(ok.map((s) => s.kill()));
  const end = performance.now();
  say(`burst over; waiting for the machines to be released (idle time ${IDLE_MS} ms)`);
  while ((await provider.list({ 'paddock-bridge': 'bench' })).length > 0) await sleep(100);
  const drainedMs = performance.now() - end;
  say('floor: one node started directly');
  const f0 = performance.now();
  const direct = await startNode({ natsUrl: cluster.url, home, id: 'burstfloor', imagesDir: images, env: nodeEnv });
  const floorNodeReadyMs = performance.now() - f0;
  await direct.stop();
  const r = {
    decisionMs: Math.round(decision - firstWait),
    firstOnNewMs: Math.round(firstOnNew - firstWait),
    machineReadyAfterDecisionMs: Math.round(firstOnNew - decision),
    allPlacedMs: Math.round(allPlaced - firstWait),
    failed,
    machinesAdded,
    drainedMs: Math.round(drainedMs),
    releasedAfterIdleMs: Math.round(drainedMs - IDLE_MS),
    floorNodeReadyMs: Math.round(floorNodeReadyMs),
    machineReadyVsFloor: Math.round(((firstOnNew - decision) / floorNodeReadyMs) * 100) / 100,
    creates: n,
    capacity: 2 * CAP,
  };
  const rows: [string, string, string][] = [
    ['decision after first refused admission', `${r.decisionMs} ms`, '≤ 1000 ms'],
    ['first sandbox on a new machine (from first refusal)', `${r.firstOnNewMs} ms`, ''],
    ['machine ready after the decision', `${r.machineReadyAfterDecisionMs} ms (${r.machineReadyVsFloor}× the floor ${r.floorNodeReadyMs} ms)`, '≤ 5000 ms'],
    ['all placed (from first refusal)', `${r.allPlacedMs} ms`, ''],
    ['creates failed', `${r.failed} of ${n}`, '0'],
    ['machines added', String(r.machinesAdded), ''],
    ['end of burst → all released', `${r.drainedMs} ms (${r.releasedAfterIdleMs} ms after the ${IDLE_MS} ms idle time)`, '≤ 10000 ms after idle'],
  ];
  for (const [k, v, t] of rows) process.stdout.write(`${k.padEnd(52)} ${v.padEnd(44)} ${t}\n`);
  if (json) process.stdout.write(`${JSON.stringify(r)}\n`);
} finally {
  await pdk.close().catch(() => {});
  await bridge.stop({ release: true });
  await cluster.stop();
  await rm(home, { recursive: true, force: true });
}

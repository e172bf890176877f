/**
 * The bridge with real container sandboxes: two nodes admitting one sandbox each, a burst of
 * three migratable ones; the third waits, runs on a machine the `local` provider adds, answers an
 * exec there; once the nodes have room again the machine is drained, its sandbox moves to them with
 * its files, and the machine is released.
 */
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { LocalProvider } from '../bridge/providers/local/index.ts';
import { startBridge } from '../ops/bridge-main.ts';
import { nodeCommand } from '../ops/launch.ts';
import { createLogger } from '../ops/log.ts';
import { connectionOf } from '../sdk/client.ts';
import { bridgeStatesHeard } from './helpers/bridge.ts';
import { clusterTest, SHARED_IMAGES } from './helpers/cluster.ts';

const test = clusterTest({ nodes: 2, env: { PADDOCK_MAX_SANDBOXES: '1', PADDOCK_WAIT_FOR_CAPACITY_MS: '55000' } });

test('a container create past capacity runs on a machine the bridge adds; when the nodes have room it moves there and the machine is released', async (t) => {
  const { pdk, cluster, home } = t.context;
  const provider = new LocalProvider({
    stateDir: join(home, 'bridge', 'local'),
    command: () => nodeCommand({ dieWithParent: false }),
    env: { PADDOCK_MAX_SANDBOXES: '1', PADDOCK_HEARTBEAT_MS: '500', PADDOCK_IMAGES_DIR: SHARED_IMAGES, PADDOCK_FN: '0', PADDOCK_FN_BUILD: '0' },
  });
  const b = await startBridge({
    natsUrl: cluster.url,
    provider,
    log: createLogger('bridge', 'warn'),
    env: { PADDOCK_BRIDGE_SHAPE: 'cpu=64,memory=65536,sandboxes=1', PADDOCK_BRIDGE_MAX_MACHINES: '1', PADDOCK_BRIDGE_IDLE_MS: '1500', PADDOCK_BRIDGE_TAG: 'ctr' },
  });
  try {
    while (!b.host.leading) await sleep(100);
    await bridgeStatesHeard(connectionOf(pdk));
    const sbs = await Promise.all([1, 2, 3].map(() => pdk.sandboxes.create({ cpu: 0.1, memoryMiB: 64, migratable: true })));
    t.teardown(() => Promise.all(sbs.map((s) => s.kill().catch(() => {}))));
    const [machine] = await provider.list({ 'paddock-bridge': 'ctr' });
    t.truthy(machine);
    const onNew = sbs.find((s) => s.info.node === machine?.id);
    if (!onNew) return t.fail('the third sandbox runs on the new machine');
    t.is((await onNew.exec(['sh', '-c', 'echo made on the new machine > /root/note && cat /root/note'])).stdout, 'made on the new machine\n');
    const firstId = onNew.id;
    // While the two nodes are full, the machine holding a migratable sandbox stays: there is no room to move it to.
    await sleep(3000);
    t.is((await provider.list({ 'paddock-bridge': 'ctr' })).length, 1);
    // Room on the nodes: the bridge drains the machine, its node moves the sandbox there, and the machine is released.
    await Promise.all(sbs.filter((s) => s !== onNew).map((s) => s.kill()));
    for (let i = 0; i < 300 && (await provider.list({ 'paddock-bridge': 'ctr' })).length > 0; i++) await sleep(200);
    t.deepEqual(await provider.list({ 'paddock-bridge': 'ctr' }), []);
    t.is((await onNew.exec(['cat', '/root/note'])).stdout, 'made on the new machine\n');
    t.not(onNew.id, firstId);
    t.true(cluster.nodes.some((n) => n.id === onNew.info.node), `it runs on a node of the fleet now (${onNew.info.node})`);
    const status = b.host.status();
    t.true(status.decisions.some((d) => d.action === 'drain' && /migratable/.test(d.reason)), JSON.stringify(status.decisions));
  } finally {
    await b.stop({ release: true });
  }
});

/**
 * The bridge with real container sandboxes: two nodes admitting one sandbox each, a burst of
 * three; the third waits, runs on a machine the `local` provider adds, answers an exec there, and
 * the machine is released once idle.
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

test('a container create past capacity runs on a machine the bridge adds, which is released once idle', async (t) => {
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
    const sbs = await Promise.all([1, 2, 3].map(() => pdk.sandboxes.create({ cpu: 0.1, memoryMiB: 64 })));
    const [machine] = await provider.list({ 'paddock-bridge': 'ctr' });
    t.truthy(machine);
    const onNew = sbs.find((s) => s.info.node === machine?.id);
    t.truthy(onNew, 'the third sandbox runs on the new machine');
    t.is((await onNew?.exec(['echo', 'hello from the new machine']))?.stdout, 'hello from the new machine\n');
    await Promise.all(sbs.map((s) => s.kill()));
    for (let i = 0; i < 300 && (await provider.list({ 'paddock-bridge': 'ctr' })).length > 0; i++) await sleep(200);
    t.deepEqual(await provider.list({ 'paddock-bridge': 'ctr' }), []);
  } finally {
    await b.stop({ release: true });
  }
});

/** The simulated backend as the node's registry sees it (runtime/backends.ts). */
import { Limits, ProtocolError, positiveEnv } from '../../protocol/index.ts';
import type { BackendPlugin } from '../backend.ts';
import { parseLatencies, SimBackend } from './backend.ts';

export { SimBackend } from './backend.ts';

export const simPlugin: BackendPlugin = {
  kind: 'sim',
  // Virtual resources, apart from the host's: a simulated node may be far larger than the machine.
  capacity: (_cfg, env) => {
    const sandboxes = positiveEnv(env, 'PADDOCK_SIM_SANDBOXES', 10_000);
    return {
      cpu: positiveEnv(env, 'PADDOCK_SIM_CPU', 64),
      memoryMiB: positiveEnv(env, 'PADDOCK_SIM_MEMORY_MIB', 256 * 1024),
      sandboxes,
      // Admission counts writable layers against it, as for containers; by default every sandbox fits with the default layer.
      diskMiB: positiveEnv(env, 'PADDOCK_SIM_DISK_MIB', sandboxes * Limits.diskMiB.default),
    };
  },
  // The images a simulated sandbox names must exist in the store, as for a real one: placement
  // and its errors then behave the same; their layers are never read.
  checkSpec: async (spec, ctx) => {
    // A simulated sandbox has no network to open: a policy it cannot honour is refused, not ignored.
    if (spec.network) throw new ProtocolError('INVALID_SPEC', "network: the 'sim' backend has no network (it has no network.set either)", { detail: { field: 'network' } });
    const known = await ctx.images.list();
    for (const name of [spec.image, spec.toolkit, spec.workspace]) {
      if (name !== undefined && !known.includes(name)) throw new ProtocolError('INVALID_SPEC', `unknown image '${name}' (known: ${known.join(', ')})`, { detail: { field: 'image' } });
    }
  },
  async open(ctx) {
    return new SimBackend({ nodeDir: ctx.cfg.nodeDir, latencyMs: parseLatencies(ctx.env.PADDOCK_SIM_LATENCY_MS) });
  },
};

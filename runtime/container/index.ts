/** The container backend as the node's registry sees it (runtime/backends.ts). */
import { cpus, totalmem } from 'node:os';
import type { BackendPlugin } from '../backend.ts';
import { ensurePidMax, pidCapacity } from '../pids.ts';
import { ContainerBackend } from './backend.ts';

export { ContainerBackend } from './backend.ts';

export const containerPlugin: BackendPlugin = {
  kind: 'container',
  // The host's cores and RAM, times the overcommit ratios: most sandboxes idle most of the time.
  capacity: (cfg, _env, log) => ({
    cpu: Math.floor(cpus().length * cfg.overcommit.cpu * 100) / 100,
    memoryMiB: Math.floor((totalmem() / 1024 / 1024) * cfg.overcommit.memory),
    sandboxes: cfg.maxSandboxes,
    // Every sandbox's processes come out of the host's one pid table.
    pids: cfg.capacity.pids ?? pidCapacity(ensurePidMax(cfg.capacity.raisePidMax, log)),
    // The writable layers are tmpfs: RAM, promised at the memory overcommit.
    diskMiB: cfg.capacity.diskMiB ?? Math.floor((totalmem() / 1024 / 1024) * cfg.overcommit.memory),
  }),
  // Resolving the images is the check (unknown image → INVALID_SPEC); the manifest stays in the
  // node's cache for the create that follows.
  checkSpec: async (spec, ctx) => {
    await ctx.images.forSpec(spec);
  },
  async open(ctx) {
    const b = new ContainerBackend({
      nodeDir: ctx.cfg.nodeDir,
      nodeId: ctx.cfg.nodeId,
      layers: ctx.images.layers,
      binDir: ctx.cfg.binDir,
      log: ctx.log,
      resolve: (spec) => ctx.images.forSpec(spec),
      store: ctx.images.snapshotImages,
    });
    return b;
  },
};

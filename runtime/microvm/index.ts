/** The microVM backend as the node's registry sees it (runtime/backends.ts). */
import { cpus, totalmem } from 'node:os';
import { diskMiBOf, ProtocolError } from '../../protocol/index.ts';
import type { BackendPlugin } from '../backend.ts';
import { MicrovmBackend } from './backend.ts';

export { MicrovmBackend } from './backend.ts';

/** Below this a Debian kernel, its modules and the agent leave a guest too little to run anything. */
const MIN_MEMORY_MIB = 128;

export const microvmPlugin: BackendPlugin = {
  kind: 'microvm',
  // As containers: the host's cores and RAM times the overcommit ratios (clones share their
  // template's unchanged pages, so idle VMs cost far less than their memoryMiB).
  capacity: (cfg) => ({
    cpu: Math.floor(cpus().length * cfg.overcommit.cpu * 100) / 100,
    memoryMiB: Math.floor((totalmem() / 1024 / 1024) * cfg.overcommit.memory),
    sandboxes: cfg.maxSandboxes,
    diskMiB: cfg.capacity.diskMiB ?? Math.floor((totalmem() / 1024 / 1024) * cfg.overcommit.memory),
  }),
  checkSpec: async (spec, ctx) => {
    if (spec.memoryMiB < MIN_MEMORY_MIB) throw new ProtocolError('INVALID_SPEC', `memoryMiB ${spec.memoryMiB}: a microVM needs at least ${MIN_MEMORY_MIB}`, { detail: { field: 'memoryMiB' } });
    // The writable layer is a tmpfs in the guest's RAM.
    const disk = diskMiBOf(spec);
    if (disk > spec.memoryMiB / 2) throw new ProtocolError('INVALID_SPEC', `diskMiB ${disk}: a microVM's writable layer is in its memory, at most half of memoryMiB (${spec.memoryMiB})`, { detail: { field: 'diskMiB' } });
    await ctx.images.forSpec(spec);
  },
  async open(ctx) {
    const b = new MicrovmBackend({
      nodeDir: ctx.cfg.nodeDir,
      nodeId: ctx.cfg.nodeId,
      binDir: ctx.cfg.binDir,
      layers: ctx.images.layers,
      resolve: (spec) => ctx.images.forSpec(spec),
      store: ctx.images.snapshotImages,
      log: ctx.log,
      accel: ctx.env.PADDOCK_MICROVM_ACCEL || undefined,
      spares: ctx.env.PADDOCK_MICROVM_SPARES === undefined ? undefined : Number(ctx.env.PADDOCK_MICROVM_SPARES),
      balloon: ctx.env.PADDOCK_MICROVM_BALLOON !== '0',
    });
    await b.init();
    return b;
  },
};

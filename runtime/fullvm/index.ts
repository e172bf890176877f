/** The full-VM backend as the node's registry sees it (runtime/backends.ts). */
import { diskMiBOf, ProtocolError } from '../../protocol/index.ts';
import type { BackendPlugin } from '../backend.ts';
import { microvmPlugin } from '../microvm/index.ts';
import { FullvmBackend } from './backend.ts';

export { FullvmBackend } from './backend.ts';
export { desktopSpec, ensureDesktopImage } from './image.ts';

/** Xorg, a window manager and a few applications: less than this and the desktop swaps or dies. */
const MIN_MEMORY_MIB = 512;

/** PADDOCK_FULLVM_VIEW=host:port for the live views (default 127.0.0.1 on a free port). */
function viewListen(v: string | undefined): { host: string; port: number } | undefined {
  if (!v) return undefined;
  const i = v.lastIndexOf(':');
  const port = Number(v.slice(i + 1));
  if (i < 0 || !Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`PADDOCK_FULLVM_VIEW=${v}: expected host:port`);
  return { host: v.slice(0, i) || '127.0.0.1', port };
}

export const fullvmPlugin: BackendPlugin = {
  kind: 'fullvm',
  capacity: microvmPlugin.capacity,
  checkSpec: async (spec, ctx) => {
    if (spec.memoryMiB < MIN_MEMORY_MIB) throw new ProtocolError('INVALID_SPEC', `memoryMiB ${spec.memoryMiB}: a full VM needs at least ${MIN_MEMORY_MIB}`, { detail: { field: 'memoryMiB' } });
    const disk = diskMiBOf(spec);
    if (disk > spec.memoryMiB / 2) throw new ProtocolError('INVALID_SPEC', `diskMiB ${disk}: a full VM's writable layer is in its memory, at most half of memoryMiB (${spec.memoryMiB})`, { detail: { field: 'diskMiB' } });
    await ctx.images.forSpec(spec).catch((e: ProtocolError) => {
      if (spec.image === 'desktop' && e.code === 'INVALID_SPEC') throw new ProtocolError('INVALID_SPEC', `${e.message} (build it with: paddock image build --desktop)`, { detail: { field: 'image' } });
      throw e;
    });
  },
  async open(ctx) {
    const b = new FullvmBackend({
      nodeDir: ctx.cfg.nodeDir,
      nodeId: ctx.cfg.nodeId,
      binDir: ctx.cfg.binDir,
      layers: ctx.images.layers,
      resolve: (spec) => ctx.images.forSpec(spec),
      store: ctx.images.snapshotImages,
      log: ctx.log,
      accel: ctx.env.PADDOCK_FULLVM_ACCEL || ctx.env.PADDOCK_MICROVM_ACCEL || undefined,
      spares: ctx.env.PADDOCK_FULLVM_SPARES === undefined ? undefined : Number(ctx.env.PADDOCK_FULLVM_SPARES),
      balloon: ctx.env.PADDOCK_MICROVM_BALLOON !== '0',
      view: viewListen(ctx.env.PADDOCK_FULLVM_VIEW),
    });
    await b.init();
    return b;
  },
};

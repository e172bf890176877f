/**
 * The backend registry: every sandbox backend this build has, by kind. A node opens the kinds
 * PADDOCK_BACKENDS names (default `container`); each brings its own capacity pool and spec checks.
 */
import type { BackendKind, Resources, SandboxSpec } from '../protocol/index.ts';
import { ProtocolError } from '../protocol/index.ts';
import { type Backend, type BackendContext, type BackendPlugin, canAdopt, type KeptSandbox } from './backend.ts';
import { containerPlugin } from './container/index.ts';
import { fullvmPlugin } from './fullvm/index.ts';
import { microvmPlugin } from './microvm/index.ts';
import { simPlugin } from './sim/index.ts';

export const registry: Partial<Record<BackendKind, BackendPlugin>> = {
  container: containerPlugin,
  microvm: microvmPlugin,
  fullvm: fullvmPlugin,
  sim: simPlugin,
};

/** Kinds that have a plugin in this build. */
export function registeredKinds(): BackendKind[] {
  return Object.keys(registry) as BackendKind[];
}

/** One opened backend of a node, with its pool. */
export interface OpenBackend {
  kind: BackendKind;
  backend: Backend;
  capacity: Resources;
  checkSpec(spec: SandboxSpec): Promise<void>;
}

/** The backends a node offers, by kind. */
export class BackendSet {
  private constructor(private readonly open: Map<BackendKind, OpenBackend>) {}

  /** Opens each kind in order; if one fails, those already open are closed again. */
  static async open(kinds: readonly BackendKind[], ctx: BackendContext): Promise<BackendSet> {
    const open = new Map<BackendKind, OpenBackend>();
    try {
      for (const kind of kinds) {
        const plugin = registry[kind];
        if (!plugin) throw new Error(`no backend plugin for '${kind}'`);
        const backend = await plugin.open(ctx);
        open.set(kind, { kind, backend, capacity: plugin.capacity(ctx.cfg, ctx.env, ctx.log), checkSpec: (spec) => plugin.checkSpec(spec, ctx) });
      }
    } catch (e) {
      await Promise.allSettled([...open.values()].map((b) => b.backend.close()));
      throw e;
    }
    return new BackendSet(open);
  }

  get kinds(): BackendKind[] {
    return [...this.open.keys()];
  }

  all(): OpenBackend[] {
    return [...this.open.values()];
  }

  get(kind: BackendKind): OpenBackend | undefined {
    return this.open.get(kind);
  }

  /** The backend for a spec, or INVALID_SPEC naming what this node has. */
  for(kind: BackendKind, nodeId: string): OpenBackend {
    const b = this.open.get(kind);
    if (!b) throw new ProtocolError('INVALID_SPEC', `backend '${kind}' is not available on node ${nodeId} (available: ${this.kinds.join(', ')})`);
    return b;
  }

  /** Leftovers of a previous run, of every backend. */
  async recover(): Promise<Record<string, string[]>> {
    const out: Record<string, string[]> = {};
    for (const b of this.open.values()) {
      const ids = await b.backend.recover();
      if (ids.length > 0) out[b.kind] = ids;
    }
    return out;
  }

  /** Sandboxes of a previous run the backends kept (recover), to be taken up by the node. */
  kept(): Array<KeptSandbox & { kind: BackendKind }> {
    const out: Array<KeptSandbox & { kind: BackendKind }> = [];
    for (const b of this.open.values()) if (canAdopt(b.backend)) for (const k of b.backend.kept()) out.push({ kind: b.kind, ...k });
    return out;
  }

  async close(): Promise<void> {
    const results = await Promise.allSettled([...this.open.values()].map((b) => b.backend.close()));
    const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) throw failed.reason;
  }
}

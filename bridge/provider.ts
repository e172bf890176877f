/**
 * The one interface a provider plugin implements (one folder each under bridge/providers/). A
 * provider makes machines that run a Paddock node joining this cluster's NATS; the bridge decides
 * when. Every machine carries the bridge's tags, so a bridge that restarts finds (adopts) what an
 * earlier one started instead of starting more or leaking it.
 */
import type { Shape } from './machine.ts';

export type { Shape };

export interface ProvisionRequest {
  /** The machine's name; also its node id (PADDOCK_NODE_ID), so the node table says when it joined. */
  id: string;
  shape: Shape;
  /** Written on the machine (a cloud's tags or labels; a file for `local` and `ssh`): what `list` filters on. */
  tags: Record<string, string>;
  /** The NATS the machine's node joins. */
  natsUrl: string;
}

export interface ProvidedMachine {
  id: string;
  tags: Record<string, string>;
  /** Epoch ms. */
  createdAt: number;
  /** Where it runs, for people (a pid, a host, an instance id). */
  where: string;
  /** Listed but running nothing (its start was cut short): to release, not to adopt. */
  gone?: boolean;
}

export interface Provider {
  /** The plugin's name (`local`, `ssh`, …). */
  readonly name: string;
  /**
   * Starts a machine of `shape` running a node named `id`. Resolves once the provider has done its
   * part (the node process started); the bridge then waits for the node to join. On failure it
   * rejects with a message a person can act on; the bridge then calls `release(id)` as well.
   */
  provision(req: ProvisionRequest): Promise<ProvidedMachine>;
  /** Stops the machine's node and gives the machine back. Idempotent: an unknown id is no error. */
  release(id: string): Promise<void>;
  /** The machines that exist and carry every tag in `tags`. */
  list(tags: Record<string, string>): Promise<ProvidedMachine[]>;
  /** What a person reads in `paddock bridge status`: the shape, the pool, the limits. */
  describe(): Record<string, unknown>;
}

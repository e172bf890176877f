/**
 * Binds a node's FnCall service (runtime/fncall/) to NATS: invocations arrive on
 * `pdk.v1.fn.invoke` in the FN_QUEUE queue group, so any node takes any invocation.
 */
import type { NatsConnection, Subscription } from '@nats-io/transport-node';
import type { Logger } from 'pino';
import { FN_QUEUE, type FnLanguage, Limits, subjects, validateFnInvoke } from '../protocol/index.ts';
import type { FnService } from '../runtime/fncall/service.ts';
import { serve } from './bind.ts';

export class FnHost {
  private sub?: Subscription;

  constructor(
    private readonly nc: NatsConnection,
    readonly service: FnService,
    private readonly log: Logger,
  ) {}

  async start(): Promise<void> {
    await this.service.start();
    this.sub = serve(this.nc, subjects.fnInvoke, { queue: FN_QUEUE, log: this.log, name: 'fn.invoke', maxBytes: Limits.requestBytesMax }, (req) => this.service.invoke(validateFnInvoke(req.body)));
  }

  /** FnCall's part of the node record: the languages it has images for, and its load. */
  record(images: string[]): { languages: FnLanguage[]; running: number; queued: number } {
    return { languages: this.service.languages(images), ...this.service.load };
  }

  stats() {
    return this.service.stats();
  }

  /** The images FnCall needs on this node, and how far making them has come. */
  imageStates() {
    return this.service.imageStates();
  }

  async stop(): Promise<void> {
    this.sub?.unsubscribe();
    await this.service.stop();
  }
}

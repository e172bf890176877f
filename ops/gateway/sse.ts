/** Server-Sent Events onto a response, waiting for the socket to drain: a slow reader slows the stream instead of filling memory. */
import { once } from 'node:events';
import type { ServerResponse } from 'node:http';

export class SseWriter {
  constructor(
    private readonly res: ServerResponse,
    private readonly signal: AbortSignal,
  ) {}

  private async write(s: string): Promise<void> {
    if (this.signal.aborted || this.res.destroyed) throw new Error('the client went away');
    if (!this.res.write(s)) await once(this.res, 'drain', { signal: this.signal });
  }

  event(name: string, data: unknown): Promise<void> {
    return this.write(`event: ${name}\ndata: ${JSON.stringify(data)}\n\n`);
  }

  comment(text: string): Promise<void> {
    return this.write(`: ${text}\n\n`);
  }
}

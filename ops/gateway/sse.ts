/** Server-Sent Events onto a response, waiting for the socket to drain: a slow reader slows the stream instead of filling memory. */
import { isUtf8 } from 'node:buffer';
import { once } from 'node:events';
import type { ServerResponse } from 'node:http';
import { TextDecoder } from 'node:util';

/**
 * One output stream's bytes as JSON string literals, chunk by chunk. A character split between
 * two chunks is held back and sent whole with the next; `end()` gives what is left (an incomplete
 * character then reads as U+FFFD, as TextDecoder makes it).
 *
 * Valid UTF-8 (nearly all output) takes a fast path: its bytes read as latin1 are one byte per
 * character, JSON.stringify escapes just what JSON needs (all below 0x80), and written back as
 * latin1 they are the same bytes. That skips decoding to UTF-16 and encoding back, which with
 * JSON.stringify on the decoded string was most of the gateway's CPU per streamed MiB.
 */
export class JsonText {
  private held: Buffer | undefined;
  private readonly decoder = new TextDecoder();

  /** The JSON literal of what is complete so far, and the encoding to write it in. */
  next(d: Uint8Array): JsonLiteral {
    const view = Buffer.from(d.buffer, d.byteOffset, d.byteLength);
    const b = this.held ? Buffer.concat([this.held, view]) : view;
    const cut = completeUpTo(b);
    this.held = cut < b.length ? Buffer.from(b.subarray(cut)) : undefined;
    return literal(b.subarray(0, cut), this.decoder);
  }

  /** What was held back, if anything: the end of the stream. */
  end(): JsonLiteral | undefined {
    const h = this.held;
    this.held = undefined;
    return h ? literal(h, this.decoder) : undefined;
  }
}

/**
 * The most output one SSE event carries. The node sends output in events of up to 256 KiB (fewer
 * messages: half the node's and a third less of nats-server's CPU per MiB), but a string over
 * V8's 128 KiB regular-object limit is a large object, mapped and unmapped on its own: the
 * gateway then took ~480 page faults and 16 ms of CPU per MiB, against 10 ms in 64 KiB pieces.
 */
export const SSE_SLICE_BYTES = 64 * 1024;

/** `d` in pieces of at most SSE_SLICE_BYTES (views, as Buffers), each with where it starts in `d`. */
export function* slices(d: Uint8Array): Generator<[Buffer, number]> {
  const b = Buffer.from(d.buffer, d.byteOffset, d.byteLength);
  for (let at = 0; at < b.length; at += SSE_SLICE_BYTES) yield [b.subarray(at, at + SSE_SLICE_BYTES), at];
}

export interface JsonLiteral {
  json: string;
  encoding: 'latin1' | 'utf8';
}

function literal(b: Buffer, decoder: TextDecoder): JsonLiteral {
  if (isUtf8(b)) return { json: JSON.stringify(b.toString('latin1')), encoding: 'latin1' };
  return { json: JSON.stringify(decoder.decode(b)), encoding: 'utf8' };
}

/** Where the last character of `b` that is complete ends: a lead byte in the last three whose sequence runs past the end starts the held part. */
function completeUpTo(b: Buffer): number {
  const n = b.length;
  for (let i = n - 1; i >= Math.max(0, n - 3); i--) {
    const c = b[i] as number;
    if ((c & 0xc0) === 0x80) continue;
    if (c < 0xc0) return n;
    const need = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
    return i + need <= n ? n : i;
  }
  return n;
}

export class SseWriter {
  constructor(
    private readonly res: ServerResponse,
    private readonly signal: AbortSignal,
  ) {}

  private async write(s: string, encoding: BufferEncoding = 'utf8'): Promise<void> {
    if (this.signal.aborted || this.res.destroyed) throw new Error('the client went away');
    if (!this.res.write(s, encoding)) await once(this.res, 'drain', { signal: this.signal });
  }

  event(name: string, data: unknown): Promise<void> {
    return this.write(`event: ${name}\ndata: ${JSON.stringify(data)}\n\n`);
  }

  /** An event whose data is `{"text": <t>}`, or `{"text": <t>, "offset": <offset>}`. */
  text(name: string, t: JsonLiteral, offset?: number): Promise<void> {
    const more = offset === undefined ? '' : `,"offset":${offset}`;
    // The name and the rest are ASCII: the same bytes in latin1 and in UTF-8.
    return this.write(`event: ${name}\ndata: {"text":${t.json}${more}}\n\n`, t.encoding);
  }

  comment(text: string): Promise<void> {
    return this.write(`: ${text}\n\n`);
  }
}

/**
 * What a stream has received and its reader not yet taken, at most `max` items: past it the
 * newest are counted, not kept, and the reader gets the count in their place, in order. A reader
 * that stops reading (an HTTP client that keeps its connection open and reads nothing) otherwise
 * made the gateway hold every message for as long as it stayed connected.
 */
export class Backlog<T> {
  private readonly q: Array<{ item: T } | { dropped: number }> = [];
  private kept = 0;
  private wake: (() => void) | undefined;
  private closed = false;

  constructor(private readonly max: number) {}

  push(item: T): void {
    if (this.closed) return;
    if (this.kept < this.max) {
      this.q.push({ item });
      this.kept++;
    } else {
      // Consecutive drops are one count: the queue grows by at most one entry per item kept.
      const last = this.q[this.q.length - 1];
      if (last && 'dropped' in last) last.dropped++;
      else this.q.push({ dropped: 1 });
    }
    this.wake?.();
  }

  /** The next item or count of dropped items, waiting for one; undefined once closed. */
  async take(): Promise<{ item: T } | { dropped: number } | undefined> {
    while (this.q.length === 0) {
      if (this.closed) return undefined;
      await new Promise<void>((r) => {
        this.wake = r;
      });
      this.wake = undefined;
    }
    const next = this.q.shift();
    if (next && 'item' in next) this.kept--;
    return next;
  }

  close(): void {
    this.closed = true;
    this.wake?.();
  }
}

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

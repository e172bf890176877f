import { Packr } from 'msgpackr';
import { ProtocolError } from './errors.ts';

// useRecords: false keeps payloads standard MessagePack maps, readable by any client (nats-py +
// msgpack included). moreTypes: false keeps msgpackr's private extensions off the wire.
const packr = new Packr({ useRecords: false, moreTypes: false, int64AsType: 'number', mapsAsObjects: true });

export function encode(value: unknown): Uint8Array {
  return packr.pack(value);
}

/** Decodes a payload, mapping any decoder failure to INVALID_REQUEST. An empty payload is `{}`. */
export function decode(data: Uint8Array): unknown {
  if (data.length === 0) return {};
  try {
    return packr.unpack(data);
  } catch (e) {
    throw new ProtocolError('INVALID_REQUEST', 'payload is not valid MessagePack', { cause: e });
  }
}

/**
 * Decodes a request: every request is a MessagePack map (an empty payload counts as `{}`).
 * Anything else is INVALID_REQUEST, on every subject — including the byte 0xC1, which MessagePack
 * never uses and msgpackr decodes to a sentinel object that would otherwise pass for a map.
 */
export function decodeRequest(data: Uint8Array): Record<string, unknown> {
  const v = decode(data);
  if (typeof v === 'object' && v !== null) {
    const proto = Object.getPrototypeOf(v);
    if (proto === Object.prototype || proto === null) return v as Record<string, unknown>;
  }
  throw new ProtocolError('INVALID_REQUEST', 'payload is not a MessagePack map: every request is a map of fields', { detail: { field: 'payload' } });
}

/** The fixed head of encodeOutputEvent's MessagePack: `{t, s, d}` with `s` a uint64 and `d` a bin32. */
const OUTPUT_HEAD = 25;

/**
 * A streamed exec's output event, `{t: 'out'|'err', s, d}`, as MessagePack written straight into
 * one buffer from the output's parts: the same bytes any decoder reads (`s` always a uint64, `d` a
 * bin32: an event is at most STREAM_CHUNK_BYTES), with one copy of the output where joining the
 * parts and then encoding made two. The node streams ~100 MiB/s this way, and each copy is a fresh
 * buffer V8 has to collect. `d` is the output, a view of `wire`.
 */
export function encodeOutputEvent(t: 'out' | 'err', s: number, parts: readonly Uint8Array[], bytes: number): { wire: Uint8Array; d: Uint8Array } {
  const wire = Buffer.allocUnsafe(OUTPUT_HEAD + bytes);
  let at = 0;
  wire[at++] = 0x83;
  wire[at++] = 0xa1;
  wire[at++] = 0x74;
  at = wire.write(t === 'out' ? '\xa3out' : '\xa3err', at, 'latin1') + at;
  wire[at++] = 0xa1;
  wire[at++] = 0x73;
  wire[at++] = 0xcf;
  at = wire.writeBigUInt64BE(BigInt(s), at);
  wire[at++] = 0xa1;
  wire[at++] = 0x64;
  wire[at++] = 0xc6;
  at = wire.writeUInt32BE(bytes, at);
  for (const p of parts) {
    wire.set(p, at);
    at += p.length;
  }
  return { wire, d: wire.subarray(OUTPUT_HEAD) };
}

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

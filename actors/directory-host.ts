/**
 * The sandbox directory on the wire: `pdk.v1.sandboxes.list` (filters and pages) and
 * `pdk.v1.sandboxes.get`, answered by any placement replica from the `pdk_sandboxes` bucket, so a
 * client needs no JetStream of its own to find its sandboxes.
 */
import { type KV, Kvm } from '@nats-io/kv';
import { type NatsConnection, RequestError } from '@nats-io/transport-node';
import type { Logger } from 'pino';
import { Buckets, check, decode, encode, PLACEMENT_QUEUE, ProtocolError, type Reply, Schema, type SandboxInfo, scanKv, selectSandboxes, subjects } from '../protocol/index.ts';
import { traceHeaders } from '../protocol/trace.ts';
import { serve } from './bind.ts';

/** Room left in a page for the reply's envelope. */
const PAGE_OVERHEAD = 16 * 1024;
const INFO_TIMEOUT_MS = 5000;

export class DirectoryHost {
  private kvp?: Promise<KV>;
  private readonly subs: Array<{ unsubscribe(): void }> = [];

  constructor(
    private readonly nc: NatsConnection,
    private readonly log: Logger,
  ) {}

  start(): void {
    const o = { queue: PLACEMENT_QUEUE, log: this.log };
    this.subs.push(serve(this.nc, subjects.sandboxesList, { ...o, name: 'sandboxes.list' }, (req) => this.list(req.body)));
    this.subs.push(serve(this.nc, subjects.sandboxesGet, { ...o, name: 'sandboxes.get' }, (req) => this.get(req.body)));
  }

  stop(): void {
    for (const s of this.subs) s.unsubscribe();
  }

  /** The bucket, opened when first asked: a node creates it before it serves. */
  directory(): Promise<KV> {
    this.kvp ??= new Kvm(this.nc).open(Buckets.sandboxes).catch((err: unknown) => {
      this.kvp = undefined;
      throw new ProtocolError('UNAVAILABLE', `no sandbox directory (bucket ${Buckets.sandboxes}): ${(err as Error).message}`);
    });
    return this.kvp;
  }

  private async list(body: unknown): Promise<Schema.SandboxesListReply> {
    const q = check(Schema.SandboxesListRequest, body, 'INVALID_REQUEST', 'sandboxes.list');
    const after = q.cursor === undefined ? undefined : parseCursor(q.cursor);
    const rows = selectSandboxes(
      (await scanKv<SandboxInfo>(await this.directory())).map((e) => e.value),
      { ...q, ...(after ? { after } : {}) },
    );
    // A page ends at `limit` rows or when the next row would not fit the reply, whichever first.
    const budget = (this.nc.info?.max_payload ?? 1024 * 1024) - PAGE_OVERHEAD;
    const page: SandboxInfo[] = [];
    let bytes = 0;
    for (const info of rows) {
      const size = encode(info).length;
      if (page.length >= q.limit || (page.length > 0 && bytes + size > budget)) break;
      page.push(info);
      bytes += size;
    }
    const last = page.at(-1);
    return page.length < rows.length && last ? { sandboxes: page, next: `${last.createdAt}:${last.id}` } : { sandboxes: page };
  }

  /** The live record from the sandbox's actor, else the directory's (an ended sandbox), else NOT_FOUND. */
  async get(body: unknown): Promise<SandboxInfo> {
    const { id } = check(Schema.SandboxesGetRequest, body, 'INVALID_REQUEST', 'sandboxes.get');
    return this.lookup(id);
  }

  async lookup(id: string): Promise<SandboxInfo> {
    try {
      const m = await this.nc.request(subjects.sandbox(id, 'info'), encode({}), { timeout: INFO_TIMEOUT_MS, headers: traceHeaders() });
      const r = decode(m.data) as Reply<SandboxInfo>;
      if (r.ok) return r.result;
    } catch (err) {
      if (!(err instanceof RequestError && err.isNoResponders())) this.log.debug({ err, id }, 'sandbox info did not answer; reading the directory');
    }
    const e = await (await this.directory()).get(id);
    if (e?.operation === 'PUT') return decode(e.value) as SandboxInfo;
    throw new ProtocolError('NOT_FOUND', `sandbox ${id} does not exist`, { detail: { id } });
  }
}

function parseCursor(c: string): { createdAt: number; id: string } {
  const i = c.indexOf(':');
  const createdAt = Number(c.slice(0, i));
  if (i <= 0 || !Number.isFinite(createdAt)) throw new ProtocolError('INVALID_REQUEST', 'cursor: not a cursor this listing gave', { detail: { field: 'cursor' } });
  return { createdAt, id: c.slice(i + 1) };
}

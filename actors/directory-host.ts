/**
 * The sandbox directory on the wire: `pdk.v1.sandboxes.list` (filters and pages) and
 * `pdk.v1.sandboxes.get`, answered by any placement replica from the `pdk_sandboxes` bucket, so a
 * client needs no JetStream of its own to find its sandboxes. The snapshot table (`pdk_snapshots`)
 * likewise: `pdk.v1.snapshots.list`, and `pdk.v1.snapshots.delete` passed on to the node whose
 * disk holds the snapshot.
 */
import { type KV, Kvm } from '@nats-io/kv';
import { type NatsConnection, RequestError } from '@nats-io/transport-node';
import type { Logger } from 'pino';
import { request } from '../protocol/connection.ts';
import {
  Buckets,
  check,
  decode,
  encode,
  isMap,
  isToken,
  PLACEMENT_QUEUE,
  ProtocolError,
  type Reply,
  type SandboxInfo,
  Schema,
  type SnapshotInfo,
  type SnapshotsDeleteReply,
  scanKv,
  selectSandboxes,
  subjects,
} from '../protocol/index.ts';
import { traceHeaders } from '../protocol/trace.ts';
import { serve } from './bind.ts';

/** Room left in a page for the reply's envelope. */
const PAGE_OVERHEAD = 16 * 1024;
const INFO_TIMEOUT_MS = 5000;
/** A node removes a snapshot's files in well under a second; a busy one gets this long. */
const SNAPSHOT_DELETE_TIMEOUT_MS = 30_000;
/** What `spec.fromSnapshot` takes from the snapshot when the create does not say. */
const FROM_SNAPSHOT = ['backend', 'image', 'toolkit', 'workspace', 'memoryMiB', 'cpu', 'diskMiB', 'display', 'node'] as const;

export class DirectoryHost {
  private kvp?: Promise<KV>;
  private snapp?: Promise<KV>;
  private readonly subs: Array<{ unsubscribe(): void }> = [];

  constructor(
    private readonly nc: NatsConnection,
    private readonly log: Logger,
    /** The connection its buckets are read over (the node's JetStream connection; default `nc`). */
    private readonly store: NatsConnection = nc,
  ) {}

  start(): void {
    const o = { queue: PLACEMENT_QUEUE, log: this.log };
    this.subs.push(serve(this.nc, subjects.sandboxesList, { ...o, name: 'sandboxes.list' }, (req) => this.list(req.body)));
    this.subs.push(serve(this.nc, subjects.sandboxesGet, { ...o, name: 'sandboxes.get' }, (req) => this.get(req.body)));
    this.subs.push(serve(this.nc, subjects.snapshotsList, { ...o, name: 'snapshots.list' }, (req) => this.listSnapshots(req.body)));
    this.subs.push(serve(this.nc, subjects.snapshotsDelete, { ...o, name: 'snapshots.delete' }, (req) => this.deleteSnapshot(req.body)));
  }

  stop(): void {
    for (const s of this.subs) s.unsubscribe();
  }

  /** The bucket, opened when first asked: a node creates it before it serves. */
  directory(): Promise<KV> {
    this.kvp ??= new Kvm(this.store).open(Buckets.sandboxes).catch((err: unknown) => {
      this.kvp = undefined;
      throw new ProtocolError('UNAVAILABLE', `no sandbox directory (bucket ${Buckets.sandboxes}): ${(err as Error).message}`);
    });
    return this.kvp;
  }

  /** The snapshot table, opened when first asked (a node makes it; a cluster without one has no snapshots). */
  private snapshotTable(): Promise<KV> {
    this.snapp ??= new Kvm(this.store).open(Buckets.snapshots).catch((err: unknown) => {
      this.snapp = undefined;
      throw new ProtocolError('UNAVAILABLE', `no snapshot table (bucket ${Buckets.snapshots}): ${(err as Error).message}`);
    });
    return this.snapp;
  }

  private async snapshotRecords(): Promise<SnapshotInfo[]> {
    try {
      return (await scanKv<SnapshotInfo>(await this.snapshotTable())).map((e) => e.value);
    } catch (err) {
      // No node has made the bucket yet: no snapshot either.
      if (/stream not found/i.test((err as Error).message)) return [];
      throw err;
    }
  }

  private async snapshotRecord(id: string): Promise<SnapshotInfo | undefined> {
    try {
      const e = await (await this.snapshotTable()).get(id);
      return e?.operation === 'PUT' ? (decode(e.value) as SnapshotInfo) : undefined;
    } catch (err) {
      if (/stream not found/i.test((err as Error).message)) return undefined;
      throw err;
    }
  }

  private async listSnapshots(body: unknown): Promise<Schema.SnapshotsListReply> {
    const q = check(Schema.SnapshotsListRequest, body, 'INVALID_REQUEST', 'snapshots.list');
    const rows = (await this.snapshotRecords()).filter((s) => (q.node === undefined || s.node === q.node) && (q.from === undefined || s.from === q.from));
    return { snapshots: rows.sort((a, b) => a.createdAt - b.createdAt || (a.id < b.id ? -1 : 1)) };
  }

  /** Passed on to the snapshot's node, which removes its files and then its record. Idempotent. */
  private async deleteSnapshot(body: unknown): Promise<SnapshotsDeleteReply> {
    const { id } = check(Schema.SnapshotsDeleteRequest, body, 'INVALID_REQUEST', 'snapshots.delete');
    const rec = await this.snapshotRecord(id);
    if (!rec) return { deleted: false };
    let m: Awaited<ReturnType<typeof request>>;
    try {
      m = await request(this.nc, subjects.node(rec.node, 'snapshots.delete'), encode({ id }), { timeout: SNAPSHOT_DELETE_TIMEOUT_MS, headers: traceHeaders(), resend: true });
    } catch (err) {
      throw new ProtocolError('UNAVAILABLE', `snapshot ${id} is on node ${rec.node}, which does not answer (${(err as Error).message}): its files are there; ask again once the node is back`, { detail: { id, node: rec.node } });
    }
    const r = decode(m.data) as Reply<SnapshotsDeleteReply>;
    if (!r.ok) throw new ProtocolError(r.error.code, r.error.message, { detail: r.error.detail });
    return r.result;
  }

  /**
   * A create body with `spec.fromSnapshot` completed from the snapshot's record: on its node, of
   * its machine. A value the create gives that differs is INVALID_SPEC; an unknown snapshot is
   * NOT_FOUND. Other bodies come back as they were.
   */
  async withSnapshot(body: unknown): Promise<unknown> {
    if (!isMap(body) || !isMap(body.spec) || body.spec.fromSnapshot === undefined || body.spec.fromSnapshot === null) return body;
    const spec = body.spec as Record<string, unknown>;
    const id = spec.fromSnapshot;
    // Not a key the table can hold ('', a dot): the spec's check says what is wrong with it.
    if (!isToken(id)) return body;
    const rec = await this.snapshotRecord(id);
    if (!rec) throw new ProtocolError('NOT_FOUND', `no snapshot ${id} (pdk.v1.snapshots.list lists them)`, { detail: { field: 'fromSnapshot', snapshot: id } });
    const merged: Record<string, unknown> = { ...spec };
    // A snapshot of a container's files is an image in the store: any node, any size; the
    // snapshot's size is the default. A VM's state loads only into its machine: on its node, or on
    // any node once the state is in the store too.
    const files = rec.backend === 'container';
    const anyNode = files || rec.state !== undefined;
    for (const f of FROM_SNAPSHOT) {
      const want = rec[f];
      const given = spec[f];
      const free = (files && (f === 'memoryMiB' || f === 'cpu' || f === 'diskMiB')) || (anyNode && f === 'node');
      if (given === undefined || given === null) {
        if (want !== undefined && !(anyNode && f === 'node')) merged[f] = want;
      } else if (!free && JSON.stringify(given) !== JSON.stringify(want)) {
        throw new ProtocolError('INVALID_SPEC', `${f}: snapshot ${id} ${f === 'node' ? 'is on node' : `was taken of a sandbox with ${f}`} ${JSON.stringify(want)}, not ${JSON.stringify(given)}`, { detail: { field: f } });
      }
    }
    return { ...body, spec: merged };
  }

  private async list(body: unknown): Promise<Schema.SandboxesListReply> {
    const q = check(Schema.SandboxesListRequest, body, 'INVALID_REQUEST', 'sandboxes.list');
    const after = q.cursor === undefined ? undefined : parseCursor(q.cursor);
    const rows = selectSandboxes(
      // Keys with a dot are the directory's own marks (the last sweep), not sandboxes.
      (await scanKv<SandboxInfo>(await this.directory())).flatMap((e) => (e.key.includes('.') ? [] : [e.value])),
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

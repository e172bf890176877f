/** Snapshots of sandboxes (a VM's whole state, a container's files): `sb.snapshot()` takes one, `pdk.sandboxes.create({ fromSnapshot })` starts from one. */
import { isToken, type SnapshotInfo, type SnapshotsDeleteReply, type SnapshotsListReply, subjects } from '../protocol/index.ts';
import { InvalidRequestError } from './errors.ts';
import type { CallOptions, Transport } from './transport.ts';

export interface SnapshotListOptions extends CallOptions {
  /** Only snapshots on this node. */
  node?: string;
  /** Only snapshots of this sandbox. */
  from?: string;
}

export class Snapshots {
  constructor(private readonly t: Transport) {}

  /** The snapshots of every node, oldest first. */
  async list(opts: SnapshotListOptions = {}): Promise<SnapshotInfo[]> {
    const { timeoutMs, signal, ...filters } = opts;
    return (await this.t.request<SnapshotsListReply>(subjects.snapshotsList, filters, { timeoutMs, signal })).snapshots;
  }

  /**
   * Removes a snapshot's files from its node; sandboxes made from it run on. Deleting one that is
   * not there (deleted before) is harmless: false.
   */
  async delete(id: string, opts?: CallOptions): Promise<boolean> {
    if (!isToken(id)) throw new InvalidRequestError('INVALID_REQUEST', `snapshot id: must be 1-64 characters of [A-Za-z0-9_-], got ${JSON.stringify(id)}`, { detail: { field: 'id' } });
    return (await this.t.request<SnapshotsDeleteReply>(subjects.snapshotsDelete, { id }, opts)).deleted;
  }
}

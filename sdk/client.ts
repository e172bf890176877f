/** The entry point: `Paddock.connect()`, then `pdk.sandboxes.create(...)`. */
import { readFileSync } from 'node:fs';
import { Kvm } from '@nats-io/kv';
import { type NatsConnection, connect as natsConnect } from '@nats-io/transport-node';
import { natsServers, natsUrlFile } from '../protocol/discovery.ts';
import { Buckets, type CreateReply, decode, type GroupReply, type GroupVerb, isToken, natsFailure, newSandboxId, type SandboxesListReply, type SandboxInfo, type SandboxSpec, type SandboxState, scanKv, selectSandboxes, subjects } from '../protocol/index.ts';
import { AlreadyExistsError, InvalidRequestError, NotFoundError, PaddockError, TimeoutError, UnavailableError } from './errors.ts';
import { Fn } from './fn.ts';
import { Nodes } from './nodes.ts';
import { PendingCreates } from './pending.ts';
import { Rollouts } from './rollouts.ts';
import { Sandbox } from './sandbox.ts';
import { Snapshots } from './snapshots.ts';
import { type CallOptions, Transport } from './transport.ts';

export interface ConnectOptions {
  /**
   * NATS URL(s): an array, or one string with commas between URLs (as NATS_URL takes them); every
   * server is tried, in turn, when connecting and reconnecting. Default: $NATS_URL, else the
   * embedded NATS that `npm start` wrote down.
   */
  servers?: string | string[];
  /** Default timeout of remote calls (default 60 s). */
  timeoutMs?: number;
  name?: string;
}

export type CreateSpec = Partial<SandboxSpec>;

export interface ListOptions extends CallOptions {
  /** Every label given must match. */
  labels?: Record<string, string>;
  group?: string;
  /** Only these states (default: creating, running and stopping; with `all`, every state). */
  state?: SandboxState[];
  node?: string;
  backend?: SandboxSpec['backend'];
  /** Include sandboxes that have ended, and sleeping ones (default: only live ones). */
  all?: boolean;
}

function defaultServers(): string {
  if (process.env.NATS_URL) return process.env.NATS_URL;
  try {
    return readFileSync(natsUrlFile(), 'utf8').trim();
  } catch {
    throw new UnavailableError('UNAVAILABLE', `no NATS_URL and no embedded Paddock found (${natsUrlFile()}): run 'paddock up' (npm start) or set NATS_URL`);
  }
}

/** Each client's connection, kept out of the class: the SDK's surface has no way to it. */
const connections = new WeakMap<Paddock, NatsConnection>();

/**
 * The NATS connection under a client, for this repository's own tools and tests (the CLI's status,
 * the gateway, benchmarks). Not exported by the package (`sdk/index.ts`): a trainer never needs it.
 */
export function connectionOf(pdk: Paddock): NatsConnection {
  const nc = connections.get(pdk);
  if (!nc) throw new Error('not a connected Paddock client');
  return nc;
}

export class Paddock {
  readonly sandboxes: Sandboxes;
  /** Sandboxes driven through recorded steps: a restarted trainer replays instead of re-running. */
  readonly rollouts: Rollouts;
  /** Verbs on every sandbox of a training job at once (created with `group`). */
  readonly groups: Groups;
  /** Node records, and what a node reports about itself (layer cache counters included). */
  readonly nodes: Nodes;
  /** One-shot invocations (FnCall): `pdk.fn.invoke({ language, code, stdin, limits, tests })`. */
  readonly fn: Fn;
  /** Snapshots of sandboxes (`sb.snapshot()`: a VM's whole state, a container's files): list and delete; `sandboxes.create({ fromSnapshot })` starts from one. */
  readonly snapshots: Snapshots;

  private constructor(
    private readonly nc: NatsConnection,
    private readonly t: Transport,
  ) {
    this.sandboxes = new Sandboxes(t);
    this.rollouts = new Rollouts(t, this.sandboxes);
    this.groups = new Groups(t);
    this.nodes = new Nodes(t);
    this.fn = new Fn(t);
    this.snapshots = new Snapshots(t);
  }

  static async connect(opts: ConnectOptions = {}): Promise<Paddock> {
    const servers = natsServers(opts.servers ?? defaultServers());
    // A trainer outlives a NATS restart: keep reconnecting (calls meanwhile time out, as they would
    // against a slow server), and a streamed exec asks for what it missed once back (sandbox.ts).
    // noAsyncTraces: otherwise nats.js captures a stack trace for every request, in case it fails;
    // the SDK's own errors carry the caller's stack.
    const nc = await natsConnect({ servers, name: opts.name ?? 'paddock-sdk', maxReconnectAttempts: -1, reconnectTimeWait: 500, noAsyncTraces: true }).catch((err: unknown) => {
      throw new UnavailableError('UNAVAILABLE', `cannot connect to NATS at ${servers.join(',')}: ${(err as Error).message}`, { cause: err });
    });
    const pdk = new Paddock(nc, new Transport(nc, opts.timeoutMs ?? 60_000));
    connections.set(pdk, nc);
    return pdk;
  }

  async close(): Promise<void> {
    // Draining needs a server to flush to: with NATS away (the client reconnects for ever) it
    // would wait for one, so a connection that is down is closed at once.
    if (!this.t.isConnected) return this.nc.close();
    await this.nc.drain();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

export class Sandboxes {
  private readonly pending: PendingCreates;

  constructor(private readonly t: Transport) {
    this.pending = new PendingCreates(t);
  }

  /** @internal the directory's record of a sandbox (live or ended), or null. */
  readonly lookup = async (id: string, opts?: CallOptions): Promise<SandboxInfo | null> => {
    try {
      return await this.t.request<SandboxInfo>(subjects.sandboxesGet, { id }, opts);
    } catch (err) {
      if (err instanceof NotFoundError) return null;
      // No placement replica answers (the last node stopped, or none runs one): the directory in
      // JetStream still knows how the sandbox ended. The same record, read straight from the bucket.
      if (err instanceof UnavailableError) {
        const kv = await new Kvm(this.t.nc).open(Buckets.sandboxes).catch(() => null);
        const e = await kv?.get(id).catch(() => null);
        if (e?.operation === 'PUT') return decode(e.value) as SandboxInfo;
        if (kv && e !== undefined) return null;
      }
      throw err;
    }
  };

  /** Every record of the directory bucket, read straight from JetStream (no placement replica answers). */
  private async directoryRecords(opts: CallOptions): Promise<SandboxInfo[]> {
    const none = (err: unknown) => new UnavailableError('UNAVAILABLE', `nothing answers ${subjects.sandboxesList}, and there is no sandbox directory (bucket ${Buckets.sandboxes}): is a Paddock node running?`, { cause: err });
    const kv = await new Kvm(this.t.nc).open(Buckets.sandboxes).catch((err: unknown) => {
      throw none(err);
    });
    // open() does not look the bucket up; the scan is the first to find that its stream is missing.
    const entries = await this.t.within(scanKv<SandboxInfo>(kv, { signal: opts.signal }), opts, 'the listing').catch((err: unknown) => {
      if (/stream not found/i.test(String((err as Error).message))) throw none(err);
      if (err instanceof PaddockError) throw err;
      // A JetStream failure (its store full, no quorum) says so with its code, never as a raw client error.
      const failure = natsFailure(err, 'the sandbox directory');
      throw failure ? new UnavailableError('UNAVAILABLE', failure.message, { cause: err, ...(failure.detail ? { detail: failure.detail } : {}) }) : err;
    });
    return entries.map((e) => e.value);
  }

  /** @internal a handle on a sandbox whose record a server sent. */
  readonly handle = (info: SandboxInfo): Sandbox => new Sandbox(this.t, info, this.lookup);

  /**
   * Creates a sandbox and resolves once it runs. The id is chosen here, which makes the create
   * safe to send again: one whose connection dropped while it was in flight is sent again when
   * the connection is back, and a node that already made it answers with it.
   */
  async create(spec: CreateSpec = {}, opts?: CallOptions): Promise<Sandbox> {
    const id = newSandboxId();
    // A placement replica that dies holding the create cannot answer: the watch says so within seconds.
    const watch = this.pending.watch(id);
    const stop = new AbortController();
    const signal = opts?.signal ? AbortSignal.any([opts.signal, stop.signal]) : stop.signal;
    try {
      // Placement waits for the node as long as this call waits (an image pulled whole can take minutes).
      const call = this.t.request<CreateReply>(subjects.placeCreate, { spec, id, timeoutMs: Math.min(3_600_000, opts?.timeoutMs ?? this.t.defaultTimeoutMs) }, { ...opts, signal });
      call.catch(() => {}); // settled by the race, or cancelled once the watch found it lost
      const r = await Promise.race([call, watch.lost]);
      return new Sandbox(this.t, r.sandbox, this.lookup);
    } catch (err) {
      // Only a create of ours can have taken this id: the first try made it, its answer was lost.
      if (err instanceof AlreadyExistsError && err.detail?.id === id) return this.get(id, opts);
      throw err;
    } finally {
      watch.done();
      stop.abort();
    }
  }

  /** A sandbox by id, with its current record (ended sandboxes included while the directory keeps them). */
  async get(id: string, opts?: CallOptions): Promise<Sandbox> {
    // An id is a subject token: `*` or `a.b` would address other subjects than one sandbox's.
    if (!isToken(id)) throw new InvalidRequestError('INVALID_REQUEST', `sandbox id: must be 1-64 characters of [A-Za-z0-9_-], got ${JSON.stringify(id)}`, { detail: { field: 'id' } });
    // The sandbox's own actor answers fastest; with none (it ended, or never was) the directory says which.
    const info = await this.t.request<SandboxInfo>(subjects.sandbox(id, 'info'), {}, opts, async () => {
      const rec = await this.lookup(id, opts);
      if (rec) return rec;
      throw new NotFoundError('NOT_FOUND', `sandbox ${id} does not exist`);
    });
    return new Sandbox(this.t, info, this.lookup);
  }

  /** Sandboxes from the directory, oldest first, filtered by labels (all must match), group, state, node and backend. */
  async list(opts: ListOptions = {}): Promise<SandboxInfo[]> {
    const { timeoutMs, signal, ...filters } = opts;
    const deadline = Date.now() + (timeoutMs ?? this.t.defaultTimeoutMs);
    const out: SandboxInfo[] = [];
    let cursor: string | undefined;
    do {
      const left = deadline - Date.now();
      if (left <= 0) throw new TimeoutError('TIMEOUT', `the listing did not finish within ${timeoutMs ?? this.t.defaultTimeoutMs} ms`);
      // With no placement replica left (every node stopped), the directory bucket is still there:
      // read it here, as `get` does, in one page.
      const page: SandboxesListReply = await this.t.request<SandboxesListReply>(subjects.sandboxesList, { ...filters, ...(cursor !== undefined ? { cursor } : {}) }, { timeoutMs: left, signal }, async () => ({
        sandboxes: selectSandboxes(await this.directoryRecords({ timeoutMs: left, signal }), filters),
      }));
      out.push(...page.sandboxes);
      cursor = page.next;
    } while (cursor !== undefined);
    return out;
  }
}

/** Connects to Paddock's NATS: `const pdk = await connect()`. */
export function connect(opts: ConnectOptions = {}): Promise<Paddock> {
  return Paddock.connect(opts);
}

const GROUP_TIMEOUT_MS = 610_000;

/** `pdk.groups.pause('job-7')`: one call, every sandbox of the group on every node, one summary. */
export class Groups {
  constructor(private readonly t: Transport) {}

  private verb(group: string, verb: GroupVerb, opts?: CallOptions): Promise<GroupReply> {
    // Killing thousands of sandboxes takes minutes: wait as long as the nodes do, unless told.
    return this.t.request<GroupReply>(subjects.group(group, verb), {}, { timeoutMs: GROUP_TIMEOUT_MS, ...opts });
  }

  pause(group: string, opts?: CallOptions): Promise<GroupReply> {
    return this.verb(group, 'pause', opts);
  }
  resume(group: string, opts?: CallOptions): Promise<GroupReply> {
    return this.verb(group, 'resume', opts);
  }
  hibernate(group: string, opts?: CallOptions): Promise<GroupReply> {
    return this.verb(group, 'hibernate', opts);
  }
  restore(group: string, opts?: CallOptions): Promise<GroupReply> {
    return this.verb(group, 'restore', opts);
  }
  kill(group: string, opts?: CallOptions): Promise<GroupReply> {
    return this.verb(group, 'kill', opts);
  }
}

/** The entry point: `Paddock.connect()`, then `pdk.sandboxes.create(...)`. */
import { readFileSync } from 'node:fs';
import { type KV, Kvm } from '@nats-io/kv';
import { connect, type NatsConnection } from '@nats-io/transport-node';
import { natsUrlFile } from '../protocol/discovery.ts';
import { Buckets, type CreateReply, decode, type GroupReply, type GroupVerb, type SandboxInfo, type SandboxSpec, type SandboxState, isToken, subjects } from '../protocol/index.ts';
import { InvalidRequestError, NotFoundError, UnavailableError } from './errors.ts';
import { Fn } from './fn.ts';
import { Rollouts } from './rollouts.ts';
import { Nodes } from './nodes.ts';
import { Sandbox } from './sandbox.ts';
import { type CallOptions, Transport } from './transport.ts';

export interface ConnectOptions {
  /** NATS URL(s). Default: $NATS_URL, else the embedded NATS that `npm start` wrote down. */
  servers?: string | string[];
  /** Default timeout of remote calls (default 60 s). */
  timeoutMs?: number;
  name?: string;
}

export type CreateSpec = Partial<SandboxSpec>;

export interface ListOptions extends CallOptions {
  labels?: Record<string, string>;
  group?: string;
  /** Include sandboxes that have ended (default: only live ones). */
  all?: boolean;
}

const LIVE: ReadonlySet<SandboxState> = new Set(['creating', 'running', 'stopping']);

function defaultServers(): string {
  if (process.env.NATS_URL) return process.env.NATS_URL;
  try {
    return readFileSync(natsUrlFile(), 'utf8').trim();
  } catch {
    throw new UnavailableError('UNAVAILABLE', `no NATS_URL and no embedded Paddock found (${natsUrlFile()}): run 'paddock up' (npm start) or set NATS_URL`);
  }
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

  private constructor(
    readonly nc: NatsConnection,
    t: Transport,
  ) {
    this.sandboxes = new Sandboxes(t);
    this.rollouts = new Rollouts(t, this.sandboxes);
    this.groups = new Groups(t);
    this.nodes = new Nodes(t);
    this.fn = new Fn(t);
  }

  static async connect(opts: ConnectOptions = {}): Promise<Paddock> {
    const servers = opts.servers ?? defaultServers();
    const nc = await connect({ servers, name: opts.name ?? 'paddock-sdk' }).catch((err: unknown) => {
      throw new UnavailableError('UNAVAILABLE', `cannot connect to NATS at ${servers}: ${(err as Error).message}`, { cause: err });
    });
    return new Paddock(nc, new Transport(nc, opts.timeoutMs ?? 60_000));
  }

  async close(): Promise<void> {
    await this.nc.drain();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

export class Sandboxes {
  private kv?: Promise<KV>;

  constructor(private readonly t: Transport) {}

  private directory(): Promise<KV> {
    this.kv ??= new Kvm(this.t.nc).open(Buckets.sandboxes);
    return this.kv;
  }

  /** @internal the directory record of a sandbox, or null. */
  readonly lookup = async (id: string): Promise<SandboxInfo | null> => {
    const e = await (await this.directory()).get(id);
    return e && e.operation === 'PUT' ? (decode(e.value) as SandboxInfo) : null;
  };

  /** Creates a sandbox and resolves once it runs. */
  async create(spec: CreateSpec = {}, opts?: CallOptions): Promise<Sandbox> {
    const r = await this.t.request<CreateReply>(subjects.placeCreate, { spec }, opts);
    return new Sandbox(this.t, r.sandbox, this.lookup);
  }

  /** A sandbox by id, with its current record (ended sandboxes included while the directory keeps them). */
  async get(id: string, opts?: CallOptions): Promise<Sandbox> {
    // An id is a subject token: `*` or `a.b` would address other subjects than one sandbox's.
    if (!isToken(id)) throw new InvalidRequestError('INVALID_REQUEST', `sandbox id: must be 1-64 characters of [A-Za-z0-9_-], got ${JSON.stringify(id)}`, { detail: { field: 'id' } });
    const info = await this.t.request<SandboxInfo>(subjects.sandbox(id, 'info'), {}, opts, async () => {
      // No actor answers: the sandbox ended (the directory says how) or never was.
      const rec = await this.lookup(id);
      if (rec) return rec;
      throw new NotFoundError('NOT_FOUND', `sandbox ${id} does not exist`);
    });
    return new Sandbox(this.t, info, this.lookup);
  }

  /** Sandboxes from the directory, filtered by labels (all must match) and group. */
  async list(opts: ListOptions = {}): Promise<SandboxInfo[]> {
    const kv = await this.directory();
    const out: SandboxInfo[] = [];
    // A Set: a key written while the listing runs (a sandbox changing state) comes back again.
    const unique = new Set<string>();
    for await (const k of await kv.keys()) unique.add(k);
    const keys = [...unique];
    const batch = 64;
    for (let i = 0; i < keys.length; i += batch) {
      const got = await Promise.all(keys.slice(i, i + batch).map((k) => kv.get(k)));
      for (const e of got) {
        if (e?.operation !== 'PUT') continue;
        const info = decode(e.value) as SandboxInfo;
        if (!opts.all && !LIVE.has(info.state)) continue;
        if (opts.group !== undefined && info.group !== opts.group) continue;
        if (opts.labels && !Object.entries(opts.labels).every(([k, v]) => info.labels[k] === v)) continue;
        out.push(info);
      }
    }
    return out.sort((a, b) => a.createdAt - b.createdAt);
  }
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

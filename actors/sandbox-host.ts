/**
 * Binds one sandbox actor to NATS: it subscribes to `pdk.v1.sb.<id>.>`, turns verbs into events
 * or backend calls, and publishes every transition as an event and a directory record.
 */
import { cpus, constants as osConstants } from 'node:os';
import type { KV } from '@nats-io/kv';
import type { NatsConnection, Subscription } from '@nats-io/transport-node';
import { context, type Span, SpanKind, SpanStatusCode, trace } from '@opentelemetry/api';
import type { Logger } from 'pino';
import { type Actor, type ActorOptions, type ActorSystem, createActor, fromPromise } from 'xstate';
import type { StepJournal } from '../chronus/journal.ts';
import {
  type Capability,
  decode,
  type EndReason,
  type ExecEvent,
  type ExecResult,
  type ExecVerdict,
  encode,
  type ForkReply,
  type ForkRequest,
  isSandboxVerb,
  Limits,
  type ProcessEvent,
  type ProcessInfo,
  ProtocolError,
  parseSandboxSubject,
  type SandboxInfo,
  type SandboxSpec,
  type SandboxState,
  type SandboxVerb,
  SandboxVerbTable,
  type SnapshotInfo,
  subjects,
  subjectTemplate,
  unavailable,
  validateExec,
  validateSandboxRequest,
  validateStep,
} from '../protocol/index.ts';
import { Attr } from '../protocol/trace.ts';
import { type Backend, canForwardPorts, canSnapshot, type Display, EXEC_KILLED, type ExecOptions, type ExecOutcome, hasDisplay, hasProcesses, type Processes } from '../runtime/backend.ts';
import { Semaphore } from '../runtime/limit.ts';
import { type Request, STREAMED, serve, tracer } from './bind.ts';
import { ExecStream, STREAM_KEEP_MS } from './exec-stream.ts';
import { FileTransfers } from './file-transfers.ts';
import type { Inspector } from './inspect.ts';
import { PortSessions } from './port-sessions.ts';
import { ProcessTable } from './processes.ts';
import { allows, isAsleep, isFinal, publicState, type AdoptedState, type SandboxContext, type SandboxEvent, sandboxMachine } from './sandbox.ts';

export interface SandboxHostDeps {
  nc: NatsConnection;
  backend: Backend;
  directory: KV;
  nodeId: string;
  log: Logger;
  maxOutputBytes: number;
  /** Output each background process keeps per stream (default Limits.processes.bufferBytes.default); a request may ask for another size. */
  processBufferBytes?: number;
  /** Output each streamed exec keeps for exec.resume (default STREAM_BUFFER_BYTES). */
  streamBufferBytes?: number;
  /** Largest message the connection may publish; bounds a non-streamed exec's reply. */
  maxPayload: number;
  clock?: ActorOptions<typeof sandboxMachine>['clock'];
  /** Called once, when the sandbox reaches a final state. */
  onFinal: (host: SandboxHost) => void;
  /** The command log: an exec or write that carries a rollout step runs through it, at most once. */
  journal?: StepJournal;
  /** Sees every transition of the sandbox's actor (inspect.ts). */
  inspect?: Inspector;
  /** Start from this snapshot of the backend (its own name for it) instead of the spec's image. */
  restoreFrom?: string;
  /** The node's snapshots and forks: they need its admission, disk budget and snapshot table. */
  snapshots?: SandboxSnapshots;
  /**
   * A sandbox of the node's previous run that its backend kept and this run takes up: it keeps its
   * record's times, starts where the backend kept it (`as`), and its create is nothing more.
   */
  adopt?: { createdAt: number; expiresAt: number; as: AdoptedState; sleepReason?: string };
}

/** What the `snapshot` and `fork` verbs ask of the node that holds the sandbox. */
export interface SandboxSnapshots {
  snapshot(h: SandboxHost): Promise<SnapshotInfo>;
  fork(h: SandboxHost, req: ForkRequest): Promise<ForkReply>;
}

/** Execs one sandbox starts at once (execSlots): half the node's CPUs, so one sandbox's execs leave the other half to the rest. */
const EXEC_STARTS_PER_SANDBOX = Math.max(1, Math.floor(cpus().length / 2));
/** How long an exec holds its start slot at most: well past a `crun exec` (~3–20 ms here). */
const EXEC_START_HOLD_MS = 100;

/**
 * States a sandbox passes through on its way to the next in a moment (a freeze, a thaw, a kill):
 * published as events, not written to the directory, which holds where it settles. Each directory
 * write is a JetStream write the node waits for: a group pause of 3,200 made 6,400 of them.
 */
const PASSING_STATES: ReadonlySet<SandboxState> = new Set(['pausing', 'resuming', 'stopping']);

/** How long a new sandbox's first directory write is tried again while JetStream is unavailable. */
const CLAIM_RETRY_MS = 30_000;

/** Room for the reply's envelope and fields around stdout and stderr. */
const REPLY_OVERHEAD = 64 * 1024;

/** Each sandbox actor is the root of an actor system of its own: its effects find their host by it. */
// biome-ignore lint/suspicious/noExplicitAny: xstate's own AnyActorSystem is ActorSystem<any>
const hosts = new WeakMap<ActorSystem<any>, SandboxHost>();

export class SandboxHost {
  /**
   * The sandbox machine with the backend's effects, provided once for every sandbox: `provide`
   * rebuilds the whole state tree, which cost ~0.5 ms of the node's CPU and ~30 KiB of heap per
   * create (measured) — heap that every later fork of the node (crun, mount) then pays for too.
   */
  private static readonly machine = sandboxMachine.provide({
    actors: {
      create: fromPromise(async ({ system }) => {
        const h = SandboxHost.of(system);
        const from = h.deps.restoreFrom;
        const b = h.deps.backend;
        if (h.deps.adopt) return;
        if (from === undefined) await b.create(h.id, h.spec);
        else if (canSnapshot(b)) await b.restoreFrom(from, h.id, h.spec);
        else throw new ProtocolError('INVALID_SPEC', `backend ${h.spec.backend} has no snapshots`, { detail: { field: 'fromSnapshot' } });
      }),
      destroy: fromPromise(async ({ system }) => {
        const h = SandboxHost.of(system);
        // The reason tells the exec's verdict (KILLED) from a caller's cancel (CANCELLED).
        for (const c of h.execs.values()) c.abort(EXEC_KILLED);
        h.portSessions?.closeAll();
        h.processes.killAll();
        await h.deps.backend.destroy(h.id);
      }),
      pause: SandboxHost.verb((b, id) => b.pause(id)),
      resume: SandboxHost.verb((b, id) => b.resume(id)),
      hibernate: SandboxHost.verb(async (b, id) => {
        const o = await b.hibernate(id);
        return { bytes: o.releasedBytes ?? 0, swapped: o.swapped ?? false };
      }),
      restore: SandboxHost.verb((b, id) => b.restore(id)),
    },
  });

  /** A backend call on the sandbox of the actor that invokes it. */
  private static verb<T>(call: (backend: Backend, id: string) => Promise<T>) {
    return fromPromise<T, { id: string }>(async ({ system }) => {
      const h = SandboxHost.of(system);
      return call(h.deps.backend, h.id);
    });
  }

  // biome-ignore lint/suspicious/noExplicitAny: see `hosts`
  private static of(system: ActorSystem<any>): SandboxHost {
    const h = hosts.get(system);
    if (!h) throw new Error('sandbox actor without a host');
    return h;
  }

  info: SandboxInfo;
  /**
   * Set while a drain moves it to another node (node-host migrate): calls other than `info` are
   * refused, UNAVAILABLE with reason `moving` (the SDK waits and asks again, then finds it moved),
   * so nothing it does after its files are copied is lost with it.
   */
  moving = false;
  private readonly actor: Actor<typeof sandboxMachine>;
  private sub?: Subscription;
  private logger?: Logger;
  private readonly execs = new Map<string, AbortController>();
  /** Connections to its ports (ports.* verbs), made on first use. */
  private portSessions?: PortSessions;
  /** @internal background processes and terminals (process.* verbs). */
  readonly processes: ProcessTable;
  /** Streamed execs, running and recently ended (STREAM_KEEP_MS), by execId. */
  private readonly streams = new Map<string, ExecStream>();
  /** Directory uploads, downloads and watches under way. */
  readonly transfers: FileTransfers;
  /**
   * Execs of this sandbox starting at once; the rest wait their turn. Starting one (`crun exec`:
   * joining the namespaces and cgroups) costs the node's CPU, not the sandbox's quota: 1,000
   * concurrent execs in one sandbox were 1,000 crun processes at once and a neighbour's exec timed
   * out. A slot is held until the exec ends or EXEC_START_HOLD_MS have passed, so a long-running
   * exec (a server, a watcher) never keeps the next one waiting for longer.
   */
  private readonly execSlots = new Semaphore(EXEC_STARTS_PER_SANDBOX);
  /** Directory writes in transition order. */
  private published: Promise<void> = Promise.resolve();
  private readonly waiters: Array<{ states: SandboxState[]; resolve: (state: SandboxState) => void }> = [];
  private lastActivity = Date.now();
  /** The directory holds this sandbox's record under its id: its first write took the id. */
  private claimed = false;
  /**
   * Another sandbox had the id (a create sent again, whose first try made it elsewhere): this one
   * writes nothing under the id, and is removed.
   */
  private duplicateOf?: SandboxInfo;
  private starting?: Promise<SandboxInfo>;
  /** The last directory write failed (NATS away): the record there is stale until `republish`. */
  private staleRecord = false;

  constructor(
    private readonly deps: SandboxHostDeps,
    readonly id: string,
    readonly spec: SandboxSpec,
  ) {
    const now = Date.now();
    const createdAt = deps.adopt?.createdAt ?? now;
    const expiresAt = deps.adopt?.expiresAt ?? now + spec.ttlSec * 1000;
    this.processes = new ProcessTable(id);
    this.info = {
      id,
      node: deps.nodeId,
      state: 'creating',
      backend: spec.backend,
      image: spec.image,
      cpu: spec.cpu,
      memoryMiB: spec.memoryMiB,
      labels: spec.labels,
      qos: spec.qos,
      idleAction: spec.idleAction,
      createdAt,
      expiresAt,
    };
    if (spec.toolkit) this.info.toolkit = spec.toolkit;
    if (spec.workspace) this.info.workspace = spec.workspace;
    if (spec.group) this.info.group = spec.group;
    if (spec.idleTimeoutSec !== undefined) this.info.idleTimeoutSec = spec.idleTimeoutSec;
    this.actor = createActor(SandboxHost.machine, {
      input: { id, ttlMs: Math.max(0, expiresAt - now), idleAction: spec.idleAction, ...(spec.idleTimeoutSec !== undefined ? { idleMs: spec.idleTimeoutSec * 1000 } : {}), ...(deps.adopt ? { adopted: deps.adopt.as, ...(deps.adopt.sleepReason ? { sleepReason: deps.adopt.sleepReason } : {}) } : {}) },
      ...(deps.clock ? { clock: deps.clock } : {}),
      ...(deps.inspect ? { inspect: deps.inspect } : {}),
    });
    this.transfers = new FileTransfers(() => deps.backend.files(id), spec.backend, deps.nc, () => this.log);
    hosts.set(this.actor.system, this);
    this.actor.subscribe((snap) => this.onSnapshot(publicState(snap.value), snap.context));
  }

  /** The sandbox's logger, made when first needed: most sandboxes never log a line of their own. */
  private get log(): Logger {
    this.logger ??= this.deps.log.child({ sandbox: this.id });
    return this.logger;
  }

  get state(): SandboxState {
    return publicState(this.actor.getSnapshot().value);
  }

  /** When the last exec or file call ended (or the sandbox started); 0 while one is in flight. */
  idleSince(): number {
    return this.actor.getSnapshot().context.inflight > 0 ? 0 : this.lastActivity;
  }

  /**
   * Starts the actor; resolves once the sandbox runs or has failed, with its record published.
   * Called again (a create sent twice), it answers as the first call does. ALREADY_EXISTS when the
   * id turned out to be another sandbox's: this one is then removed without a trace.
   */
  start(): Promise<SandboxInfo> {
    this.starting ??= (async () => {
      // The node's logger: serve logs only failures, and their subject names the sandbox.
      this.sub = serve(this.deps.nc, subjects.sandboxAll(this.id), { log: this.deps.log, nodeId: this.deps.nodeId }, (req) => this.handle(req));
      this.publishEvent();
      this.actor.start();
      await this.until([this.deps.adopt?.as ?? 'running', 'stopped', 'failed']);
      await this.published;
      if (!this.claimed && !this.duplicateOf && (this.state === 'running' || this.state === 'paused' || this.state === 'hibernated')) {
        // Not in the directory, no one could find it, and another node may yet take its id: a
        // create that cannot be recorded fails (the caller may try again) rather than leak.
        await this.kill();
        throw new ProtocolError('UNAVAILABLE', `sandbox ${this.id} could not be recorded in the sandbox directory within ${CLAIM_RETRY_MS / 1000} s (JetStream unavailable): removed`, { detail: { id: this.id, what: 'the sandbox directory' } });
      }
      const had = this.duplicateOf;
      if (had) {
        this.log.warn({ owner: had.node, state: had.state }, 'the sandbox id was taken by the time its record was written (a create sent again): removing this copy');
        await this.kill();
        throw new ProtocolError('ALREADY_EXISTS', `sandbox ${this.id} already exists (on node ${had.node}, ${had.state})`, { detail: { id: this.id, node: had.node, state: had.state } });
      }
      return this.info;
    })();
    return this.starting;
  }

  /** The backend saw the sandbox end by itself (its init died): it fails with reason `crashed`. */
  crashed(why: string): void {
    this.actor.send({ type: 'CRASHED', error: { code: 'BACKEND_FAILED', message: `sandbox ${this.id} crashed: ${why}`, retryable: false } });
  }

  /** Kills the sandbox; resolves once it is gone and its final record is published. */
  async kill(reason: EndReason = 'killed'): Promise<SandboxInfo> {
    this.actor.send({ type: 'KILL', reason });
    await this.until(['stopped', 'failed']);
    await this.published;
    return this.info;
  }

  /**
   * Sends a lifecycle event and waits for the state it settles in. An event the current state does
   * not take (resume while running, pause while stopping) is refused with INVALID_STATE.
   */
  async lifecycle(event: Extract<SandboxEvent, { type: 'PAUSE' | 'RESUME' | 'HIBERNATE' | 'RESTORE' }>): Promise<SandboxInfo> {
    const from = this.state;
    if (!this.actor.getSnapshot().can(event)) {
      throw new ProtocolError('INVALID_STATE', `sandbox ${this.id} is ${from}: cannot ${event.type.toLowerCase()}`, { detail: { state: from } });
    }
    this.actor.send(event);
    // The state it settled in, not the one it is in after the write below: a call that woke it may
    // have been followed at once by the memory-pressure watch putting it back to sleep.
    const settled = await this.until(SETTLED);
    await this.published;
    const err = this.actor.getSnapshot().context.error;
    const wanted: Record<typeof event.type, SandboxState> = { PAUSE: 'paused', HIBERNATE: 'hibernated', RESUME: 'running', RESTORE: 'running' };
    if (settled !== wanted[event.type]) {
      throw new ProtocolError(err?.code ?? 'BACKEND_FAILED', `sandbox ${this.id} did not ${event.type.toLowerCase()}: it is ${settled}${err ? ` (${err.message})` : ''}`);
    }
    return this.info;
  }

  /** Wakes a sleeping sandbox for a call that needs it running (`autoResume`), or refuses. */
  private async awake(verb: SandboxVerb): Promise<void> {
    await this.until(SETTLED);
    const st = this.state;
    if (st === 'running') return;
    if ((st === 'paused' || st === 'hibernated') && this.spec.autoResume) {
      this.log.info({ verb, from: st }, 'waking sandbox for a call');
      // A wake for a call is activity: the memory-pressure watch, which picks the longest idle,
      // must not take it back to sleep between its restore and the call (seen in CI: the exec then
      // found it hibernating).
      this.lastActivity = Date.now();
      await this.lifecycle({ type: st === 'paused' ? 'RESUME' : 'RESTORE' }).catch((e: unknown) => {
        // Two calls may wake it at once: the loser finds it running.
        if (this.state !== 'running') throw e;
      });
      return;
    }
    throw new ProtocolError('INVALID_STATE', `sandbox ${this.id} is ${st}: '${verb}' needs it running${st === 'paused' || st === 'hibernated' ? ' (autoResume is off: resume it first)' : ''}`, { detail: { state: st } });
  }

  /** Exec and file calls mark the sandbox busy, so the idle timer cannot fire under them. */
  /**
   * Refuses new calls (`moving`) and waits up to `ms` for those under way to end: what they
   * change must be in the copy. BUSY, and calls taken again, when they do not end in time.
   */
  async quiesce(ms: number): Promise<void> {
    this.moving = true;
    const end = Date.now() + ms;
    while (this.actor.getSnapshot().context.inflight > 0) {
      if (Date.now() > end) {
        this.moving = false;
        throw new ProtocolError('BUSY', `sandbox ${this.id} still has calls under way after ${ms} ms`);
      }
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  private async active<T>(fn: () => Promise<T>): Promise<T> {
    this.actor.send({ type: 'ACTIVITY_START' });
    try {
      return await fn();
    } finally {
      this.lastActivity = Date.now();
      this.actor.send({ type: 'ACTIVITY_END' });
    }
  }

  /** Resolves with the first of `states` the sandbox is in (now, or when it gets there). */
  private until(states: readonly SandboxState[]): Promise<SandboxState> {
    if (states.includes(this.state)) return Promise.resolve(this.state);
    return new Promise((resolve) => this.waiters.push({ states: [...states], resolve }));
  }

  private onSnapshot(state: SandboxState, ctx: SandboxContext): void {
    if (state === this.info.state) return;
    const from = this.info.state;
    const { reason, error } = ctx;
    this.info = { ...this.info, state };
    if (reason) this.info.reason = reason;
    if (error) this.info.error = error;
    if (ctx.sleepReason) this.info.sleepReason = ctx.sleepReason;
    if (ctx.released) this.info.released = ctx.released;
    if (isFinal(state)) this.info.endedAt = Date.now();
    // Spans of transitions come from the inspector (inspect.ts). One info line per lifecycle
    // change: a person reading the log sees each sandbox come and go. At ~5 µs a line, a group
    // pause of 3,200 sandboxes costs the node ~16 ms of logging.
    if (state === 'failed') this.log.warn({ state, from, reason, error }, `sandbox ${state}`);
    else this.log.info({ state, from, ...(reason ? { reason } : {}), ...(ctx.sleepReason && state !== 'running' ? { sleepReason: ctx.sleepReason } : {}) }, `sandbox ${state}`);
    const record = encode(this.info);
    // The end goes out once the directory says so: a caller that reads the record on the event
    // reads the end, not the last live state (passing states are not written, so that was often
    // `running`). Other events go first, for their latency.
    if (isFinal(state)) this.published = this.published.then(() => this.write(record)).then(() => this.publishEvent(record));
    else {
      this.publishEvent(record);
      if (!(this.claimed && PASSING_STATES.has(state))) this.published = this.published.then(() => this.write(record));
    }
    for (const w of this.waiters.splice(0)) {
      if (w.states.includes(state)) w.resolve(state);
      else this.waiters.push(w);
    }
    if (isFinal(state)) {
      this.transfers.closeAll();
      // Drained, not unsubscribed: a request the server routed here before it saw the UNSUB would
      // be dropped by the client, and its caller would wait out its whole timeout (seen in CI: an
      // exec at the moment a drain moved its sandbox waited 70 s). Drained, it is answered below.
      void this.sub?.drain().catch(() => {});
      this.deps.onFinal(this);
    }
  }

  private async write(record: Uint8Array): Promise<void> {
    if (this.duplicateOf) return;
    try {
      if (this.claimed) await this.deps.directory.put(this.id, record);
      else await this.claim(record);
      this.staleRecord = false;
    } catch (err) {
      if (!this.staleRecord) this.log.warn({ err: unavailable(err, 'the sandbox directory') }, 'directory write failed: the record is written again once NATS is back');
      this.staleRecord = true;
    }
  }

  /**
   * The first write takes the id: a create only where nothing is, so that a create sent twice
   * (its first answer lost with a NATS server) that reached two nodes leaves one sandbox, not two,
   * at no cost to a create sent once. A record already there that is this sandbox's own (a write
   * whose acknowledgement was lost) is no conflict.
   */
  private async claim(record: Uint8Array): Promise<void> {
    // A stream that lost its leader with a NATS server answers again within seconds, once the
    // others elect one; a write that timed out may have been stored, which the next try tells.
    const deadline = Date.now() + CLAIM_RETRY_MS;
    for (;;) {
      try {
        try {
          await this.deps.directory.create(this.id, record);
          this.claimed = true;
          return;
        } catch (err) {
          const code = (err as { code?: number }).code;
          if (code !== 10071 && code !== 10164) throw err;
        }
        const e = await this.deps.directory.get(this.id);
        const had = e?.operation === 'PUT' ? (decode(e.value) as SandboxInfo) : undefined;
        if (had && !(had.node === this.deps.nodeId && had.createdAt === this.info.createdAt)) {
          this.duplicateOf = had;
          return;
        }
        await this.deps.directory.put(this.id, record);
        this.claimed = true;
        return;
      } catch (err) {
        if (Date.now() > deadline) throw err;
        await new Promise((r) => setTimeout(r, 250));
      }
    }
  }

  /** Whether the record the directory holds is the current one (after the writes under way). */
  async written(): Promise<boolean> {
    await this.published;
    return !this.staleRecord;
  }

  /** The directory's record of this sandbox is out of date (a write failed). */
  get stale(): boolean {
    return this.staleRecord;
  }

  /** Writes the current record and event again (after a reconnect); whether the directory has it. */
  async republish(): Promise<boolean> {
    const record = encode(this.info);
    this.publishEvent(record);
    this.published = this.published.then(() => this.write(record));
    return this.written();
  }

  private publishEvent(record: Uint8Array = encode(this.info)): void {
    if (this.duplicateOf) return;
    try {
      this.deps.nc.publish(subjects.event(this.id, this.info.state), record);
    } catch (err) {
      this.log.warn({ err }, 'event publish failed');
    }
  }

  private async handle(req: Request): Promise<unknown> {
    trace.getActiveSpan()?.setAttribute(Attr.backend, this.spec.backend);
    const verb = parseSandboxSubject(req.subject)?.verb ?? '';
    if (!isSandboxVerb(verb)) throw new ProtocolError('UNKNOWN_VERB', `unknown sandbox verb '${verb}'`);
    if (this.moving && verb !== 'info') throw new ProtocolError('UNAVAILABLE', `sandbox ${this.id} is moving to another node; ask again in a moment`, { detail: { reason: 'moving' } });
    const row = SandboxVerbTable[verb];
    // Ended while the request was on its way: what the directory would say (gone, and where it moved).
    if (isFinal(this.state) && !allows(this.state, verb)) {
      const { state, reason, movedTo } = this.info;
      throw new ProtocolError('NOT_FOUND', `sandbox ${this.id} is ${state}${reason ? ` (${reason})` : ''}${movedTo ? `, moved to ${movedTo}` : ''}`, { detail: { state, ...(reason ? { reason } : {}), ...(movedTo ? { movedTo } : {}) } });
    }
    if (row.wakes && isAsleep(this.state)) await this.awake(verb);
    if (!allows(this.state, verb)) {
      throw new ProtocolError('INVALID_STATE', `sandbox ${this.id} is ${this.state}: '${verb}' is not allowed`, { detail: { state: this.state } });
    }
    if ('capability' in row && !hasCapability(this.deps.backend, row.capability)) {
      throw new ProtocolError('INVALID_REQUEST', `backend ${this.spec.backend} cannot '${verb}' (it lacks the ${row.capability} capability)`);
    }
    const handler = HANDLERS[verb];
    if (row.wakes) return this.active(() => handler(this, req));
    return handler(this, req);
  }

  /** One exec through this sandbox's start slots (execSlots). */
  private startExec(opts: ExecOptions): Promise<ExecOutcome> {
    let exec: Promise<ExecOutcome> | undefined;
    const started = this.execSlots.run(async () => {
      exec = this.deps.backend.exec(this.id, opts);
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([exec.catch(() => {}), new Promise((r) => (timer = setTimeout(r, EXEC_START_HOLD_MS)))]);
      clearTimeout(timer);
    });
    return started.then(() => exec as Promise<ExecOutcome>);
  }

  /** @internal the backend, for the verb handlers below. */
  get backend(): Backend {
    return this.deps.backend;
  }

  /** @internal the sandbox's port connections, for the ports.* handlers. */
  get ports(): PortSessions {
    const b = this.deps.backend;
    if (!canForwardPorts(b)) throw new ProtocolError('INVALID_REQUEST', `backend ${this.spec.backend} cannot connect to ports (it lacks the ports capability)`);
    this.portSessions ??= new PortSessions({ sandbox: this.id, nc: this.deps.nc, log: this.log, maxPayload: this.deps.maxPayload, connect: (port) => b.connectPort(this.id, port) });
    return this.portSessions;
  }

  /** @internal the node's snapshot service, for the snapshot and fork handlers. */
  get snapshots(): SandboxSnapshots {
    if (!this.deps.snapshots) throw new ProtocolError('UNAVAILABLE', `node ${this.deps.nodeId} keeps no snapshots`);
    return this.deps.snapshots;
  }

  /** @internal */
  cancelExec(execId: unknown): boolean {
    const ctl = typeof execId === 'string' ? this.execs.get(execId) : undefined;
    ctl?.abort();
    return ctl !== undefined;
  }

  /** @internal exec.resume: the events of a stream from `from` on, sent again to its inbox. */
  resumeExec(b: { execId: string; from: number; offset?: number }): { resent: number; next: number; done: boolean } {
    const stream = this.streams.get(b.execId);
    if (!stream) throw new ProtocolError('NOT_FOUND', `no stream ${b.execId} in sandbox ${this.id} (it ended over ${STREAM_KEEP_MS / 1000} s ago, or never was)`, { detail: { execId: b.execId } });
    return stream.resume(b.from, b.offset);
  }

  /** @internal exec.credit: the caller of a streamed exec has taken `received` output bytes. */
  creditExec(b: { execId: string; received: number }): Record<string, never> {
    this.streams.get(b.execId)?.credit(b.received);
    return {};
  }

  /** @internal a files.write, through the command log when it carries a rollout step. */
  writeFile(body: { rolloutId?: string; step?: number }, w: { path: string; data: Uint8Array; offset?: number; mode?: number }, write: () => Promise<{ size: number }>) {
    const step = validateStep(body);
    return step ? this.journal().write({ ...step, sandbox: this.id }, w, write) : write();
  }

  /** @internal */
  async exec(req: Request): Promise<unknown> {
    const r = validateExec(req.body, { maxOutputBytes: this.deps.maxOutputBytes });
    const ctl = new AbortController();
    const execId = r.execId ?? `x${Math.random().toString(36).slice(2)}`;
    if (this.execs.has(execId)) throw new ProtocolError('INVALID_REQUEST', `execId ${execId} is already running`);
    const base = { cmd: r.cmd, cwd: r.cwd, env: r.env, stdin: r.stdin, timeoutMs: r.timeoutMs, maxOutputBytes: r.maxOutputBytes, signal: ctl.signal };
    const step = validateStep(r);
    if (r.stream) {
      if (step && 2 * r.maxOutputBytes + REPLY_OVERHEAD > this.deps.maxPayload) {
        throw new ProtocolError('INVALID_REQUEST', `a rollout step is recorded whole, and maxOutputBytes ${r.maxOutputBytes} cannot fit one record (max payload ${this.deps.maxPayload}): lower it`, { detail: { field: 'maxOutputBytes' } });
      }
      const reply = req.msg.reply;
      if (!reply) throw new ProtocolError('INVALID_REQUEST', 'a streamed exec needs a reply subject');
      if (this.streams.has(execId)) throw new ProtocolError('INVALID_REQUEST', `execId ${execId} was used by a stream of the last ${STREAM_KEEP_MS / 1000} s`);
      const nc = this.deps.nc;
      const log = this.log;
      // Publishing while NATS reconnects drops the message (the client keeps nothing for a server
      // it is not connected to): the stream's buffer keeps it for exec.resume.
      const stream = new ExecStream((ev: ExecEvent, wire?: Uint8Array) => {
        try {
          nc.publish(reply, wire ?? encode(ev));
        } catch (err) {
          log.debug({ err, execId }, 'stream event not sent; kept for exec.resume');
        }
      }, this.deps.streamBufferBytes, r.window);
      this.streams.set(execId, stream);
      this.execs.set(execId, ctl);
      // The span lasts as long as the stream, not as long as the request that started it.
      const span = startStreamSpan(this, req, execId);
      // The request returns at once; the stream is activity until its exit, so the idle timer waits.
      this.actor.send({ type: 'ACTIVITY_START' });
      const onOutput = (s: 'out' | 'err', d: Buffer) => stream.output(s, d);
      // A rollout step streams as it runs and is recorded whole when it ends (its output kept for
      // the record, so it must fit one, as a non-streamed step's reply must); a step recorded
      // before streams its recorded output, marked replayed, and runs nothing.
      const ran: Promise<ExecResult> =
        step !== undefined
          ? this.journal().exec({ ...step, sandbox: this.id }, r, async () => toResult(await this.startExec({ ...base, onOutput, flow: stream })))
          : this.startExec({ ...base, discard: true, onOutput, flow: stream }).then(toResult);
      void ran
        .then((o) => {
          if (o.replayed) {
            stream.output('out', o.stdout);
            stream.output('err', o.stderr);
          }
          endExecSpan(span, o.verdict, o.exitCode);
          stream.emit({ t: 'exit', exitCode: o.exitCode, ...(o.signal ? { signal: o.signal } : {}), durationMs: o.durationMs, truncated: o.truncated, timedOut: o.timedOut, verdict: o.verdict, ...(o.replayed ? { replayed: true } : {}) });
        })
        .catch((err: unknown) => {
          const wire = err instanceof ProtocolError ? err.toWire() : { code: 'BACKEND_FAILED' as const, message: (err as Error).message, retryable: true };
          failSpan(span, wire.code, wire.message);
          stream.emit({ t: 'error', error: wire });
        })
        .finally(() => {
          span.end();
          this.execs.delete(execId);
          setTimeout(() => this.streams.delete(execId), STREAM_KEEP_MS).unref();
          this.lastActivity = Date.now();
          this.actor.send({ type: 'ACTIVITY_END' });
        });
      return STREAMED;
    }
    if (2 * r.maxOutputBytes + REPLY_OVERHEAD > this.deps.maxPayload) {
      throw new ProtocolError('INVALID_REQUEST', `maxOutputBytes ${r.maxOutputBytes} cannot fit one reply (max payload ${this.deps.maxPayload}): use a streamed exec`);
    }
    this.execs.set(execId, ctl);
    try {
      const run = async () => {
        const result = toResult(await this.startExec(base));
        const span = trace.getActiveSpan();
        if (span) endExecSpan(span, result.verdict, result.exitCode);
        return result;
      };
      if (r.rolloutId !== undefined && r.step !== undefined) return await this.journal().exec({ rolloutId: r.rolloutId, step: r.step, sandbox: this.id }, r, run);
      return await run();
    } finally {
      this.execs.delete(execId);
    }
  }

  /** @internal process.start: the entry first, so that no output is missed, then the process through an exec start slot. */
  async startProcess(req: Request): Promise<ProcessInfo> {
    const b = validateSandboxRequest('process.start', req.body);
    const cmd = b.cmd ?? [];
    const entry = this.processes.add(cmd, b.bufferBytes ?? this.deps.processBufferBytes ?? Limits.processes.bufferBytes.default, { ...(b.tag !== undefined ? { tag: b.tag } : {}), ...(b.pty ? { pty: b.pty } : {}) });
    const backend = this.deps.backend as Backend & Processes;
    try {
      const running = await this.execSlots.run(() =>
        backend.startProcess(this.id, {
          cmd,
          ...(b.cwd !== undefined ? { cwd: b.cwd } : {}),
          ...(b.env !== undefined ? { env: b.env } : {}),
          ...(b.timeoutMs !== undefined ? { timeoutMs: b.timeoutMs } : {}),
          ...(b.maxOutputBytes !== undefined ? { maxOutputBytes: b.maxOutputBytes } : {}),
          ...(b.pty ? { pty: b.pty } : {}),
          onOutput: (which, d) => entry.output(which, d),
          flow: entry,
          signal: entry.abort.signal,
        }),
      );
      entry.running = running;
      entry.info = { ...entry.info, cmd: running.cmd, ...(running.pid !== undefined ? { pid: running.pid } : {}) };
      void running.done.then(
        (o) => entry.ended(o),
        (e: Error) => entry.ended(e),
      ).finally(() => this.processes.prune());
    } catch (e) {
      this.processes.remove(entry.info.id);
      throw e;
    }
    this.log.info({ process: entry.info.id, pid: entry.info.pid, pty: b.pty !== undefined }, 'process started');
    return entry.snapshot();
  }

  /** @internal process.output: what is held, then (follow) every chunk as it comes, to the request's inbox. */
  readProcess(req: Request): typeof STREAMED {
    const b = validateSandboxRequest('process.output', req.body);
    const reply = req.msg.reply;
    if (!reply) throw new ProtocolError('INVALID_REQUEST', 'process.output needs a reply subject');
    const entry = this.processes.get(b.id);
    if (b.window !== undefined) {
      if (!b.follow || b.readerId === undefined) throw new ProtocolError('INVALID_REQUEST', 'window: a holding reader follows the process and has a readerId (its credits name it)', { detail: { field: 'window' } });
      const most = Math.floor((entry.info.bufferBytes ?? 0) / 2);
      if (b.window > most) throw new ProtocolError('INVALID_REQUEST', `window: at most half the process's bufferBytes (${most}), so that what is not credited yet is still held; got ${b.window}`, { detail: { field: 'window', max: most } });
    }
    const nc = this.deps.nc;
    entry.read({ out: b.out, err: b.err, follow: b.follow, ...(b.readerId !== undefined ? { readerId: b.readerId } : {}), ...(b.window !== undefined ? { window: b.window, ...(b.stallMs !== undefined ? { stallMs: b.stallMs } : {}) } : {}) }, (ev: ProcessEvent) => {
      try {
        nc.publish(reply, encode(ev));
      } catch (err) {
        // A reader who lost some asks again from the offsets it has.
        this.log.debug({ err, process: b.id }, 'process output not sent');
      }
    });
    return STREAMED;
  }

  private journal(): StepJournal {
    if (!this.deps.journal) throw new ProtocolError('UNAVAILABLE', `node ${this.deps.nodeId} keeps no command log: rollout steps cannot run here`);
    return this.deps.journal;
  }
}

/**
 * What each verb of the table (protocol/verbs.ts) does once the host has let it through: its
 * state, wake-up and capability are checked before, from the table's row.
 */
const HANDLERS: Record<SandboxVerb, (h: SandboxHost, req: Request) => Promise<unknown>> = {
  info: async (h) => h.info,
  kill: (h) => h.kill(),
  pause: (h, req) => h.lifecycle({ type: 'PAUSE', why: validateSandboxRequest('pause', req.body).why }),
  hibernate: (h, req) => h.lifecycle({ type: 'HIBERNATE', why: validateSandboxRequest('hibernate', req.body).why }),
  resume: (h) => h.lifecycle({ type: 'RESUME' }),
  restore: (h) => h.lifecycle({ type: 'RESTORE' }),
  exec: (h, req) => h.exec(req),
  'exec.cancel': async (h, req) => ({ cancelled: h.cancelExec(validateSandboxRequest('exec.cancel', req.body).execId) }),
  'exec.resume': async (h, req) => h.resumeExec(validateSandboxRequest('exec.resume', req.body)),
  'exec.credit': async (h, req) => h.creditExec(validateSandboxRequest('exec.credit', req.body)),
  'files.read': async (h, req) => {
    const b = validateSandboxRequest('files.read', req.body);
    return h.backend.files(h.id).read(b.path, b.offset, b.length);
  },
  'files.write': async (h, req) => {
    const b = validateSandboxRequest('files.write', req.body);
    const w = { path: b.path, data: b.data, offset: b.offset, mode: b.mode };
    return h.writeFile(b, w, () => h.backend.files(h.id).write(w.path, w.data, { offset: w.offset, mode: w.mode }));
  },
  'files.list': async (h, req) => {
    const b = validateSandboxRequest('files.list', req.body);
    return { entries: await h.backend.files(h.id).list(b.path) };
  },
  'files.remove': async (h, req) => {
    const b = validateSandboxRequest('files.remove', req.body);
    await h.backend.files(h.id).remove(b.path, b.recursive === true);
    return {};
  },
  'files.upload': (h, req) => h.transfers.upload(validateSandboxRequest('files.upload', req.body)),
  'files.download': (h, req) => h.transfers.download(validateSandboxRequest('files.download', req.body)),
  'files.watch': async (h, req) => {
    const b = validateSandboxRequest('files.watch', req.body);
    if (!req.msg.reply) throw new ProtocolError('INVALID_REQUEST', 'files.watch needs a reply subject');
    await h.transfers.watch(b, req.msg.reply);
    return STREAMED;
  },
  'files.watch.renew': async (h, req) => h.transfers.renew(validateSandboxRequest('files.watch.renew', req.body).watchId),
  'files.watch.cancel': async (h, req) => h.transfers.cancel(validateSandboxRequest('files.watch.cancel', req.body).watchId),
  'network.set': async (h, req) => {
    const policy = validateSandboxRequest('network.set', req.body).policy ?? {};
    await h.backend.setNetwork?.(h.id, policy);
    return { policy };
  },
  stats: async (h) => (await h.backend.stats?.(h.id)) ?? {},
  'display.screenshot': async (h) => (h.backend as Backend & Display).screenshot(h.id),
  'display.view': async (h, req) => (h.backend as Backend & Display).view(h.id, validateSandboxRequest('display.view', req.body).control === true),
  'display.action': async (h, req) => {
    const a = validateSandboxRequest('display.action', req.body);
    const b = h.backend as Backend & Display;
    const { cursor } = await b.act(h.id, a);
    return a.action === 'screenshot' || a.screenshot ? { cursor, screenshot: await b.screenshot(h.id) } : { cursor };
  },
  snapshot: (h) => h.snapshots.snapshot(h),
  fork: (h, req) => h.snapshots.fork(h, validateSandboxRequest('fork', req.body)),
  'ports.connect': async (h, req) => {
    const b = validateSandboxRequest('ports.connect', req.body);
    await h.ports.connect(b.port, req.msg.reply, b.window);
    return STREAMED;
  },
  'ports.send': (h, req) => {
    const b = validateSandboxRequest('ports.send', req.body);
    return h.ports.send(b.connId, b.d, b.end === true);
  },
  'ports.close': async (h, req) => h.ports.close(validateSandboxRequest('ports.close', req.body).connId),
  'ports.credit': async (h, req) => {
    const b = validateSandboxRequest('ports.credit', req.body);
    return h.ports.credit(b.connId, b.received);
  },
  'ports.url': (h, req) => h.ports.url(validateSandboxRequest('ports.url', req.body).port),
  'process.start': (h, req) => h.startProcess(req),
  'process.list': async (h) => ({ processes: h.processes.list() }),
  'process.get': async (h, req) => h.processes.get(validateSandboxRequest('process.get', req.body).id).snapshot(),
  'process.wait': async (h, req) => {
    const b = validateSandboxRequest('process.wait', req.body);
    const p = h.processes.get(b.id);
    await p.wait(b.waitMs);
    return p.snapshot();
  },
  'process.kill': async (h, req) => {
    const b = validateSandboxRequest('process.kill', req.body);
    if (!(b.signal in osConstants.signals)) throw new ProtocolError('INVALID_REQUEST', `unknown signal ${b.signal}`, { detail: { field: 'signal' } });
    const p = h.processes.get(b.id);
    await p.kill(b.signal);
    return p.snapshot();
  },
  'process.input': async (h, req) => {
    const b = validateSandboxRequest('process.input', req.body);
    const p = h.processes.get(b.id);
    if (!p.running) throw new ProtocolError('INVALID_STATE', `process ${b.id} has exited`, { detail: { id: b.id } });
    if (b.data && b.data.length > 0) await p.running.write(b.data);
    if (b.eof) p.running.closeStdin();
    return {};
  },
  'process.resize': async (h, req) => {
    const b = validateSandboxRequest('process.resize', req.body);
    const p = h.processes.get(b.id);
    if (!p.info.pty) throw new ProtocolError('INVALID_REQUEST', `process ${b.id} has no terminal to resize`, { detail: { id: b.id } });
    p.running?.resize(b.cols, b.rows);
    p.info = { ...p.info, pty: { cols: b.cols, rows: b.rows } };
    return {};
  },
  'process.output': async (h, req) => h.readProcess(req),
  'process.output.cancel': async (h, req) => {
    const b = validateSandboxRequest('process.output.cancel', req.body);
    return { cancelled: h.processes.get(b.id).unfollow(b.readerId) };
  },
  'process.output.credit': async (h, req) => {
    const b = validateSandboxRequest('process.output.credit', req.body);
    h.processes.get(b.id).credit(b.readerId, b.out, b.err);
    return {};
  },
};

function hasCapability(b: Backend, cap: Capability): boolean {
  switch (cap) {
    case 'network':
      return typeof b.setNetwork === 'function';
    case 'stats':
      return typeof b.stats === 'function';
    case 'snapshot':
      return canSnapshot(b);
    case 'display':
      return hasDisplay(b);
    case 'ports':
      return canForwardPorts(b);
    case 'processes':
      return hasProcesses(b);
  }
}
/** States a lifecycle step ends in (the transient ones are on the way). */
const SETTLED: readonly SandboxState[] = ['running', 'paused', 'hibernated', 'stopped', 'failed'];

/** The backend's verdict, or the one the outcome's flags imply for a backend that gives none. */
function verdictOf(o: ExecOutcome): ExecVerdict {
  return o.verdict ?? (o.timedOut ? 'TIMEOUT' : o.truncated ? 'OUTPUT_LIMIT' : 'OK');
}

function toResult(o: ExecOutcome): ExecResult {
  const r: ExecResult = { verdict: verdictOf(o), exitCode: o.exitCode, stdout: o.stdout, stderr: o.stderr, durationMs: o.durationMs, truncated: o.truncated, timedOut: o.timedOut };
  if (o.signal) r.signal = o.signal;
  return r;
}

/** The span of a streamed exec: started with its request, ended with its exit (or failure). */
function startStreamSpan(h: SandboxHost, req: Request, execId: string): Span {
  const subject = req.subject;
  return tracer.startSpan(
    `exec.stream ${subjectTemplate(subject).template}`,
    {
      kind: SpanKind.PRODUCER,
      attributes: {
        [Attr.messagingSystem]: 'nats',
        [Attr.operationType]: 'send',
        [Attr.operationName]: 'exec.stream',
        [Attr.destinationName]: req.msg.reply ?? subject,
        [Attr.destinationTemplate]: subjectTemplate(subject).template,
        [Attr.sandboxId]: h.id,
        [Attr.nodeId]: h.info.node,
        [Attr.backend]: h.spec.backend,
        [Attr.execId]: execId,
      },
    },
    context.active(),
  );
}

function endExecSpan(span: Span, verdict: ExecVerdict, exitCode: number): void {
  span.setAttributes({ [Attr.execVerdict]: verdict, [Attr.execExitCode]: exitCode });
  // A limit that ended the command is the platform's verdict on it, an error of the call; a
  // command that exits non-zero on its own is not.
  if (verdict !== 'OK') span.setStatus({ code: SpanStatusCode.ERROR, message: verdict });
}

function failSpan(span: Span, code: string, message: string): void {
  span.setAttribute(Attr.errorCode, code);
  span.setStatus({ code: SpanStatusCode.ERROR, message });
}

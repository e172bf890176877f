/**
 * Binds one sandbox actor to NATS: it subscribes to `pdk.v1.sb.<id>.>`, turns verbs into events
 * or backend calls, and publishes every transition as an event and a directory record.
 */
import type { KV } from '@nats-io/kv';
import type { NatsConnection, Subscription } from '@nats-io/transport-node';
import { trace } from '@opentelemetry/api';
import type { Logger } from 'pino';
import { type Actor, type ActorOptions, createActor, fromPromise } from 'xstate';
import {
  type EndReason,
  type ExecEvent,
  type ExecResult,
  encode,
  isSandboxVerb,
  optionalCount,
  ProtocolError,
  requireRecord,
  type SandboxInfo,
  type SandboxSpec,
  type SandboxState,
  subjects,
  validateExec,
  validatePath,
} from '../protocol/index.ts';
import type { Backend, ExecOutcome } from '../runtime/backend.ts';
import type { ImageManifest } from '../runtime/images/store.ts';
import { type Request, STREAMED, serve } from './bind.ts';
import { allows, isFinal, sandboxMachine } from './sandbox.ts';

export interface SandboxHostDeps {
  nc: NatsConnection;
  backend: Backend;
  directory: KV;
  nodeId: string;
  log: Logger;
  maxOutputBytes: number;
  /** Largest message the connection may publish; bounds a non-streamed exec's reply. */
  maxPayload: number;
  clock?: ActorOptions<typeof sandboxMachine>['clock'];
  /** Called once, when the sandbox reaches a final state. */
  onFinal: (host: SandboxHost) => void;
}

/** Room for the reply's envelope and fields around stdout and stderr. */
const REPLY_OVERHEAD = 64 * 1024;

export class SandboxHost {
  info: SandboxInfo;
  private readonly actor: Actor<typeof sandboxMachine>;
  private sub?: Subscription;
  private readonly log: Logger;
  private readonly execs = new Map<string, AbortController>();
  /** Directory writes in transition order. */
  private published: Promise<void> = Promise.resolve();
  private readonly waiters: Array<{ states: SandboxState[]; resolve: () => void }> = [];

  constructor(
    private readonly deps: SandboxHostDeps,
    readonly id: string,
    readonly spec: SandboxSpec,
    readonly image: ImageManifest,
  ) {
    this.log = deps.log.child({ sandbox: id });
    const now = Date.now();
    this.info = {
      id,
      node: deps.nodeId,
      state: 'creating',
      backend: spec.backend,
      image: spec.image,
      cpu: spec.cpu,
      memoryMiB: spec.memoryMiB,
      labels: spec.labels,
      createdAt: now,
      expiresAt: now + spec.ttlSec * 1000,
    };
    if (spec.group) this.info.group = spec.group;
    const machine = sandboxMachine.provide({
      actors: {
        create: fromPromise(async () => deps.backend.create(id, spec, image)),
        destroy: fromPromise(async () => {
          for (const c of this.execs.values()) c.abort();
          await deps.backend.destroy(id);
        }),
      },
    });
    this.actor = createActor(machine, {
      input: { id, ttlMs: spec.ttlSec * 1000 },
      ...(deps.clock ? { clock: deps.clock } : {}),
      inspect: (ev) => {
        if (ev.type === '@xstate.snapshot' && ev.actorRef === this.actor) {
          trace.getActiveSpan()?.addEvent('sandbox.transition', { 'sandbox.id': id, 'sandbox.state': String((ev.snapshot as { value?: unknown }).value) });
        }
      },
    });
    this.actor.subscribe((snap) => this.onSnapshot(snap.value as SandboxState, snap.context.reason, snap.context.error));
  }

  get state(): SandboxState {
    return this.actor.getSnapshot().value as SandboxState;
  }

  /** Starts the actor; resolves once the sandbox runs or has failed, with its record published. */
  async start(): Promise<SandboxInfo> {
    this.sub = serve(this.deps.nc, subjects.sandboxAll(this.id), { log: this.log, name: 'sandbox' }, (req) => this.handle(req));
    this.publishEvent();
    this.actor.start();
    await this.until(['running', 'stopped', 'failed']);
    await this.published;
    return this.info;
  }

  /** Kills the sandbox; resolves once it is gone and its final record is published. */
  async kill(reason: EndReason = 'killed'): Promise<SandboxInfo> {
    this.actor.send({ type: 'KILL', reason });
    await this.until(['stopped', 'failed']);
    await this.published;
    return this.info;
  }

  private until(states: SandboxState[]): Promise<void> {
    if (states.includes(this.state)) return Promise.resolve();
    return new Promise((resolve) => this.waiters.push({ states, resolve }));
  }

  private onSnapshot(state: SandboxState, reason?: EndReason, error?: SandboxInfo['error']): void {
    if (state === this.info.state) return;
    this.info = { ...this.info, state };
    if (reason) this.info.reason = reason;
    if (error) this.info.error = error;
    if (isFinal(state)) this.info.endedAt = Date.now();
    this.log.info({ state, reason, error }, 'sandbox transition');
    this.publishEvent();
    const record = encode(this.info);
    this.published = this.published.then(async () => {
      try {
        await this.deps.directory.put(this.id, record);
      } catch (err) {
        this.log.warn({ err }, 'directory write failed');
      }
    });
    for (const w of this.waiters.splice(0)) {
      if (w.states.includes(state)) w.resolve();
      else this.waiters.push(w);
    }
    if (isFinal(state)) {
      this.sub?.unsubscribe();
      this.deps.onFinal(this);
    }
  }

  private publishEvent(): void {
    try {
      this.deps.nc.publish(subjects.event(this.id, this.info.state), encode(this.info));
    } catch (err) {
      this.log.warn({ err }, 'event publish failed');
    }
  }

  private async handle(req: Request): Promise<unknown> {
    const prefix = `pdk.v1.sb.${this.id}.`;
    const verb = req.subject.slice(prefix.length);
    if (!isSandboxVerb(verb)) throw new ProtocolError('UNKNOWN_VERB', `unknown sandbox verb '${verb}'`);
    if (!allows(this.state, verb)) {
      throw new ProtocolError('INVALID_STATE', `sandbox ${this.id} is ${this.state}: '${verb}' is not allowed`, { detail: { state: this.state } });
    }
    switch (verb) {
      case 'info':
        return this.info;
      case 'kill':
        return this.kill();
      case 'exec':
        return this.exec(req);
      case 'exec.cancel': {
        const body = requireRecord(req.body, 'exec.cancel');
        const ctl = typeof body.execId === 'string' ? this.execs.get(body.execId) : undefined;
        ctl?.abort();
        return { cancelled: ctl !== undefined };
      }
      case 'files.read': {
        const b = requireRecord(req.body, 'files.read');
        return this.deps.backend.files(this.id).read(validatePath(b.path), optionalCount(b.offset, 'offset'), optionalCount(b.length, 'length'));
      }
      case 'files.write': {
        const b = requireRecord(req.body, 'files.write');
        if (!(b.data instanceof Uint8Array)) throw new ProtocolError('INVALID_REQUEST', 'data: must be bytes');
        return this.deps.backend.files(this.id).write(validatePath(b.path), b.data, { offset: optionalCount(b.offset, 'offset'), mode: optionalCount(b.mode, 'mode', 0o7777) });
      }
      case 'files.list': {
        const b = requireRecord(req.body, 'files.list');
        return { entries: await this.deps.backend.files(this.id).list(validatePath(b.path)) };
      }
      case 'files.remove': {
        const b = requireRecord(req.body, 'files.remove');
        await this.deps.backend.files(this.id).remove(validatePath(b.path), b.recursive === true);
        return {};
      }
    }
  }

  private async exec(req: Request): Promise<unknown> {
    const r = validateExec(req.body, { maxOutputBytes: this.deps.maxOutputBytes });
    const ctl = new AbortController();
    const execId = r.execId ?? `x${Math.random().toString(36).slice(2)}`;
    if (this.execs.has(execId)) throw new ProtocolError('INVALID_REQUEST', `execId ${execId} is already running`);
    const base = { cmd: r.cmd, cwd: r.cwd, env: r.env, stdin: r.stdin, timeoutMs: r.timeoutMs, maxOutputBytes: r.maxOutputBytes, signal: ctl.signal };
    if (r.stream) {
      const reply = req.msg.reply;
      if (!reply) throw new ProtocolError('INVALID_REQUEST', 'a streamed exec needs a reply subject');
      const send = (ev: ExecEvent) => this.deps.nc.publish(reply, encode(ev));
      this.execs.set(execId, ctl);
      void this.deps.backend
        .exec(this.id, { ...base, discard: true, onOutput: (s, d) => send({ t: s, d }) })
        .then((o) => send({ t: 'exit', exitCode: o.exitCode, ...(o.signal ? { signal: o.signal } : {}), durationMs: o.durationMs, truncated: o.truncated, timedOut: o.timedOut }))
        .catch((err: unknown) => send({ t: 'error', error: { code: 'BACKEND_FAILED', message: (err as Error).message, retryable: true } }))
        .finally(() => this.execs.delete(execId));
      return STREAMED;
    }
    if (2 * r.maxOutputBytes + REPLY_OVERHEAD > this.deps.maxPayload) {
      throw new ProtocolError('INVALID_REQUEST', `maxOutputBytes ${r.maxOutputBytes} cannot fit one reply (max payload ${this.deps.maxPayload}): use a streamed exec`);
    }
    this.execs.set(execId, ctl);
    try {
      return toResult(await this.deps.backend.exec(this.id, base));
    } finally {
      this.execs.delete(execId);
    }
  }
}

function toResult(o: ExecOutcome): ExecResult {
  const r: ExecResult = { exitCode: o.exitCode, stdout: o.stdout, stderr: o.stderr, durationMs: o.durationMs, truncated: o.truncated, timedOut: o.timedOut };
  if (o.signal) r.signal = o.signal;
  return r;
}

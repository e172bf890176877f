/**
 * The schema of every message on the wire, defined once with TypeBox: each field's type, whether
 * it is bytes (MessagePack `bin`), its limits and its default. From these come the validators
 * (validate.ts), the TypeScript types the SDK and the servers use (messages.ts), the JSON Schema
 * a gateway or a Python client reads (api.ts → protocol/schema.json) and the README's table.
 *
 * Options beyond JSON Schema that the validator reads: `errorMessage` (what a person is told when
 * the field is wrong; `{value}` is the value sent) and `errorCode` (a code other than the
 * message's default, e.g. PAYLOAD_TOO_LARGE for a byte field past its size).
 */
import { type Static, type TSchema, Type } from '@sinclair/typebox';
import { type ErrorCode, ErrorCodes } from './errors.ts';
import { Limits } from './limits.ts';

const range = (r: { min: number; max: number }) => ({ minimum: r.min, maximum: r.max });
const literals = <T extends string>(values: readonly T[], opts: Record<string, unknown> = {}) => Type.Union(values.map((v) => Type.Literal(v)) as never as [ReturnType<typeof Type.Literal<T>>], opts);

// ─── Names and enums ────────────────────────────────────────────────────────────────────────────

/** Sandbox backends. FnCall is a service (`pdk.v1.fn.invoke`), not a kind of sandbox. */
export const Backends = ['container', 'microvm', 'fullvm', 'sim'] as const;
export type BackendKind = (typeof Backends)[number];

/** Lifecycle states of a sandbox, as published in events and the directory. */
export const SandboxStates = ['creating', 'running', 'pausing', 'paused', 'resuming', 'hibernating', 'hibernated', 'restoring', 'stopping', 'stopped', 'failed'] as const;
export type SandboxState = (typeof SandboxStates)[number];

export const IdleActions = ['pause', 'hibernate', 'kill'] as const;
export type IdleAction = (typeof IdleActions)[number];
export const QosClasses = ['ls', 'be'] as const;
export type QosClass = (typeof QosClasses)[number];
export const EndReasons = ['killed', 'ttl', 'idle', 'create_failed', 'node_restarted', 'node_lost', 'crashed', 'migrated'] as const;
export type EndReason = (typeof EndReasons)[number];

/**
 * How an exec ended: `OK` when it ran to its own end, else the limit that stopped it (the exit
 * code then tells what the process saw). Counter-based verdicts (pids, memory) cover the whole
 * sandbox during the exec, so two concurrent execs may both see one limit hit.
 */
/**
 * How an exec ended: `OK` when it ran to its own end, else the limit that stopped it (the exit
 * code then tells what the process saw). Counter-based verdicts (pids, memory) cover the whole
 * sandbox during the exec, so two concurrent execs may both see one limit hit. `CANCELLED`: the
 * caller cancelled it (exec.cancel, or a stream given up); `KILLED`: its sandbox was killed, or
 * ended, while it ran, or `process.kill` ended it.
 */
export const ExecVerdicts = ['OK', 'TIMEOUT', 'OUTPUT_LIMIT', 'MEMORY_LIMIT', 'PIDS_LIMIT', 'DISK_LIMIT', 'CANCELLED', 'KILLED'] as const;
export type ExecVerdict = (typeof ExecVerdicts)[number];

export const GroupVerbs = ['pause', 'resume', 'hibernate', 'restore', 'kill'] as const;
export type GroupVerb = (typeof GroupVerbs)[number];

/** FnCall (`pdk.v1.fn.invoke`): languages served from warm pools. */
export const FnLanguages = ['python', 'c', 'cpp', 'bash'] as const;
export type FnLanguage = (typeof FnLanguages)[number];
/** How one run of a program ended, judge style. */
export const FnVerdicts = ['OK', 'WRONG_ANSWER', 'TIME_LIMIT', 'MEMORY_LIMIT', 'OUTPUT_LIMIT', 'RUNTIME_ERROR', 'COMPILE_ERROR'] as const;
export type FnVerdict = (typeof FnVerdicts)[number];
/** Output against `expected`: byte for byte, line by line ignoring trailing blanks, or whitespace-separated tokens. */
export const FnCompareModes = ['exact', 'lines', 'tokens'] as const;
export type FnCompareMode = (typeof FnCompareModes)[number];

// ─── Building blocks ────────────────────────────────────────────────────────────────────────────

/** Ids become subject tokens: a safe alphabet, so no id can inject a wildcard or a dot. */
export const TOKEN_PATTERN = '^[A-Za-z0-9_-]{1,64}$';
const IMAGE_PATTERN = '^[a-z0-9][a-z0-9._-]{0,127}(:[A-Za-z0-9._-]{1,128})?$';
const NO_NUL = '^[^\\u0000]*$';

export const Token = (description: string, errorMessage = 'must be 1-64 characters of [A-Za-z0-9_-]') => Type.String({ pattern: TOKEN_PATTERN, description, errorMessage });
const ImageName = (description: string) => Type.String({ pattern: IMAGE_PATTERN, description, errorMessage: 'bad image name {value}' });
const AbsPath = (description: string) => Type.String({ pattern: `^/${NO_NUL.slice(1)}`, maxLength: Limits.files.pathMax, description, errorMessage: 'must be an absolute path' });
/** A path inside a sandbox as given by the caller: absolute, bounded, no NUL. */
export const SandboxPath = Type.String({ pattern: `^/${NO_NUL.slice(1)}`, minLength: 1, maxLength: Limits.files.pathMax, description: 'absolute path inside the sandbox', errorMessage: 'must be an absolute path without NUL' });
/** Bytes: MessagePack `bin` on NATS (base64 in JSON). */
const Bytes = (description: string, maxByteLength?: number) =>
  Type.Uint8Array({ description, ...(maxByteLength !== undefined ? { maxByteLength, errorCode: 'PAYLOAD_TOO_LARGE' satisfies ErrorCode } : {}), errorMessage: 'must be bytes' });
/** Text or bytes (a string is taken as its UTF-8 bytes). */
const TextOrBytes = (description: string) => Type.Union([Type.String(), Type.Uint8Array()], { description, errorMessage: 'must be a string or bytes' });
const Count = (description: string, max = Number.MAX_SAFE_INTEGER) => Type.Integer({ minimum: 0, maximum: max, description });
const Ms = (description: string) => Type.Number({ description });

const labelsOf = (extra: Record<string, unknown>) =>
  Type.Record(Type.String({ pattern: `^[A-Za-z0-9][A-Za-z0-9_./-]{0,${Limits.labels.keyMax - 1}}$` }), Type.String({ maxLength: Limits.labels.valueMax }), {
    additionalProperties: false,
    maxProperties: Limits.labels.max,
    description: `string → string, at most ${Limits.labels.max}; keys [A-Za-z0-9][A-Za-z0-9_./-]*`,
    ...extra,
  });
const Labels = labelsOf({ default: {} });
const envRecord = (extra: Record<string, unknown>) =>
  Type.Record(Type.String({ pattern: '^[A-Za-z_][A-Za-z0-9_]{0,255}$' }), Type.String({ maxLength: Limits.env.bytesMax }), {
    additionalProperties: false,
    maxProperties: Limits.env.max,
    description: `NAME → value, at most ${Limits.env.max} entries and ${Limits.env.bytesMax} bytes together`,
    ...extra,
  });
/** Environment variables; all of them together at most Limits.env.bytesMax bytes (checked beside the schema). */
export const Env = envRecord({});

export const WireErrorSchema = Type.Object(
  {
    code: Type.Unsafe<ErrorCode>(Type.String({ enum: Object.keys(ErrorCodes) })),
    message: Type.String(),
    retryable: Type.Boolean(),
    fault: Type.Optional(Type.Unsafe<'user' | 'system'>(Type.String({ enum: ['user', 'system'], description: "whose move it is: the caller's (`user`) or the platform's (`system`)" }))),
    detail: Type.Optional(Type.Record(Type.String(), Type.Unknown(), { description: 'machine-readable detail, e.g. `field`' })),
  },
  { $id: 'WireError', description: 'An error reply: a stable code, a message a person can act on, and whether a retry may help' },
);

// ─── Sandboxes ──────────────────────────────────────────────────────────────────────────────────

/**
 * Where a sandbox may connect. Everything not listed is refused, and so is the node itself, other
 * sandboxes and NATS unless listed. Names in `domains` resolve through the node's DNS filter only;
 * each address it answers becomes reachable on `ports` for the record's TTL.
 */
export const NetworkPolicy = Type.Object(
  {
    allow: Type.Optional(Type.Array(Type.String({ maxLength: 64 }), { maxItems: Limits.network.allowMax, description: '`CIDR`, `CIDR:port` or `CIDR:lo-hi` (IPv4), e.g. `198.18.0.0/24:443`' })),
    domains: Type.Optional(Type.Array(Type.String({ maxLength: Limits.network.domainMax }), { maxItems: Limits.network.domainsMax, description: 'exact names or `*.suffix`, e.g. `pypi.org`' })),
    ports: Type.Optional(Type.Array(Type.Integer({ minimum: 1, maximum: 65535 }), { maxItems: Limits.network.portsMax, description: 'ports reachable on addresses found through `domains` (default 80 and 443)' })),
  },
  { $id: 'NetworkPolicy', additionalProperties: false },
);
export type NetworkPolicy = Static<typeof NetworkPolicy>;

/** A full VM's screen. */
export const DisplaySpec = Type.Object(
  {
    width: Type.Integer({ minimum: Limits.display.widthMin, maximum: Limits.display.widthMax, default: Limits.display.width }),
    height: Type.Integer({ minimum: Limits.display.heightMin, maximum: Limits.display.heightMax, default: Limits.display.height }),
  },
  { $id: 'DisplaySpec', additionalProperties: false, description: `a full VM's screen in pixels (default ${Limits.display.width}×${Limits.display.height})` },
);

/** What a trainer asks for. Fields with a default may be left out. */
export const SandboxSpec = Type.Object(
  {
    backend: literals(Backends, { default: 'container', errorMessage: `unknown backend {value}; known: ${Backends.join(', ')}` }),
    image: Type.String({ pattern: IMAGE_PATTERN, default: 'busybox', errorMessage: 'bad image name {value}', description: 'the base image: its layers at the bottom, its init, user and environment' }),
    toolkit: Type.Optional(ImageName('an image whose layers go above the base (a toolchain)')),
    workspace: Type.Optional(ImageName("an image whose layers go on top (the task's files); its cwd, if not `/`, becomes the sandbox's")),
    cpu: Type.Number({ ...range(Limits.cpu), default: Limits.cpu.default, description: 'CPU cores (fractions allowed): a CFS quota' }),
    memoryMiB: Type.Integer({ ...range(Limits.memoryMiB), default: Limits.memoryMiB.default }),
    pidsLimit: Type.Integer({ ...range(Limits.pidsLimit), default: Limits.pidsLimit.default, description: 'maximum number of processes' }),
    diskMiB: Type.Optional(Type.Integer({ ...range(Limits.diskMiB), description: `size of the writable layer (absent: ${Limits.diskMiB.default})` })),
    network: Type.Optional(NetworkPolicy),
    ttlSec: Type.Number({ ...range(Limits.ttlSec), default: Limits.ttlSec.default, description: 'maximum lifetime; the sandbox is killed (reason `ttl`) when it elapses' }),
    labels: Labels,
    env: envRecord({ default: {} }),
    cwd: Type.Optional(AbsPath('default working directory for exec')),
    group: Type.Optional(Token('training job this sandbox belongs to')),
    node: Type.Optional(Token('pin to a node (placement skips scoring)', 'must be a node id')),
    placement: Type.Optional(literals(['spread', 'pack'] as const, { errorMessage: 'must be spread or pack, got {value}', description: "how a group's sandboxes are placed: `spread` over the nodes (the default: losing a node loses few of the job) or `pack` onto as few nodes as fit (they share a node's image cache, and whole nodes free up when the job ends)" })),
    idleTimeoutSec: Type.Optional(Type.Number({ ...range(Limits.idleTimeoutSec), description: 'no exec or file call for this long → `idleAction`; absent: never idles out' })),
    idleAction: literals(IdleActions, { default: 'pause', errorMessage: `must be one of ${IdleActions.join(', ')}, got {value}` }),
    qos: literals(QosClasses, { default: 'ls', errorMessage: `must be one of ${QosClasses.join(', ')}, got {value}`, description: '`ls` latency-sensitive or `be` best-effort (SCHED_IDLE, low weight)' }),
    autoResume: Type.Boolean({ default: true, description: 'exec and file calls on a paused or hibernated sandbox wake it first, or fail with INVALID_STATE' }),
    display: Type.Optional(DisplaySpec),
    migratable: Type.Optional(
      Type.Boolean({
        description:
          "a node drained with `migrate` may move it to another node: a container's files go over as a snapshot through the image store (its processes start afresh), a VM's whole state (processes and memory too) as a snapshot whose state goes through the image store; a new sandbox with its spec, labels and the rest of its TTL starts from it there. The old one ends `stopped`, reason `migrated`, with `movedTo`; the SDK's handle follows it",
      }),
    ),
    fromSnapshot: Type.Optional(
      Token('start as a copy of this snapshot (`pdk.v1.snapshots.list`): backend, image, toolkit, workspace, memoryMiB, cpu and diskMiB come from it when not given; a VM snapshot fixes them all and runs on the node that holds it, or on any node of the same machine once its state is in the image store (`state`), a container snapshot fixes only the images and runs on any node reading its image store (a different fixed value is INVALID_SPEC)', 'must be a snapshot id'),
    ),
  },
  { $id: 'SandboxSpec', additionalProperties: false, errorMessage: 'must be a map' },
);
export type SandboxSpec = Static<typeof SandboxSpec>;

/** The sandbox as the directory and `info` report it. */
export const SandboxInfo = Type.Object(
  {
    id: Type.String(),
    node: Type.String(),
    state: literals(SandboxStates),
    backend: literals(Backends),
    image: Type.String(),
    toolkit: Type.Optional(Type.String({ description: 'the image whose layers were put on top of `image`, if any' })),
    workspace: Type.Optional(Type.String({ description: 'the image on top of those, if any' })),
    cpu: Type.Number(),
    memoryMiB: Type.Number(),
    labels: Type.Record(Type.String(), Type.String()),
    group: Type.Optional(Type.String()),
    qos: literals(QosClasses),
    idleTimeoutSec: Type.Optional(Type.Number()),
    idleAction: literals(IdleActions),
    createdAt: Ms('ms since the epoch'),
    expiresAt: Ms('when the TTL kills it (ms since the epoch)'),
    endedAt: Type.Optional(Ms('ms since the epoch')),
    reason: Type.Optional(literals(EndReasons, { description: 'why it reached a final state' })),
    sleepReason: Type.Optional(Type.String({ description: 'why it last went to sleep: `idle`, `pressure`, `group`, or `requested`' })),
    released: Type.Optional(Type.Object({ bytes: Type.Number(), swapped: Type.Boolean() }, { description: 'what the last hibernation gave back to the node' })),
    error: Type.Optional(WireErrorSchema),
    movedTo: Type.Optional(Type.String({ description: 'reason `migrated`: the id of the sandbox it goes on as, on another node' })),
  },
  { $id: 'SandboxInfo' },
);
export type SandboxInfo = Static<typeof SandboxInfo>;

export const CreateRequest = Type.Object(
  {
    spec: Type.Optional(Type.Unsafe<Partial<SandboxSpec>>(Type.Ref('SandboxSpec'))),
    id: Type.Optional(Token('the new sandbox id (default: a fresh `sb-…`)')),
    waitForCapacityMs: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: 3_600_000,
        description: 'how long placement may hold the create when no node can admit it but the bridge says capacity is coming (default: the replica\'s PADDOCK_WAIT_FOR_CAPACITY_MS; 0: fail at once)',
      }),
    ),
    timeoutMs: Type.Optional(
      Type.Integer({
        minimum: 1,
        maximum: 3_600_000,
        description: "how long the caller waits for the answer: placement waits for the node's as long, less a second (default 120 s; the SDK sends its call's timeout)",
      }),
    ),
  },
  { $id: 'CreateRequest' },
);
export type CreateRequest = { spec?: Partial<SandboxSpec>; id?: string; waitForCapacityMs?: number; timeoutMs?: number };
export const CreateReply = Type.Object({ sandbox: SandboxInfo }, { $id: 'CreateReply' });
export type CreateReply = Static<typeof CreateReply>;

/** `why` a lifecycle verb is asked (shown as `sleepReason`). */
export const LifecycleRequest = Type.Object({ why: Type.Optional(Type.String({ pattern: '^[a-z_-]{1,32}$' })) }, { $id: 'LifecycleRequest' });
export const KillRequest = Type.Object({ reason: Type.Optional(Type.String()) }, { $id: 'KillRequest' });
export type KillRequest = Static<typeof KillRequest>;
export const Empty = Type.Object({}, { $id: 'Empty' });

// ─── Exec ───────────────────────────────────────────────────────────────────────────────────────

const RolloutStep = {
  rolloutId: Type.Optional(Token('command log: record this call as a step of this rollout (with `step`)')),
  step: Type.Optional(Type.Integer({ minimum: 0, description: 'command log: the step number, from 0 (with `rolloutId`)' })),
};

export const ExecRequest = Type.Object(
  {
    cmd: Type.Array(Type.String({ pattern: NO_NUL, errorMessage: 'every argument must be a string without NUL' }), {
      minItems: 1,
      maxItems: Limits.exec.argsMax,
      errorMessage: 'must be a non-empty array of strings',
      description: `argv; at most ${Limits.exec.argsMax} arguments, ${Limits.exec.argBytesMax} bytes together`,
    }),
    cwd: Type.Optional(AbsPath('working directory (default: the spec’s, or the image’s)')),
    env: Type.Optional(Env),
    stdin: Type.Optional(Bytes('standard input', Limits.exec.stdinMax)),
    timeoutMs: Type.Number({ ...range(Limits.exec.timeoutMs), default: Limits.exec.timeoutMs.default }),
    maxOutputBytes: Type.Optional(Type.Integer({ ...range(Limits.exec.maxOutputBytes), description: 'cap on stdout and on stderr, each (default: the node’s, 1 MiB); past it the process tree is killed' })),
    stream: Type.Optional(Type.Boolean({ description: 'stream output to the reply inbox as `{t,d}` events ending with `exit`' })),
    execId: Type.Optional(Token('names a streamed exec so that `exec.cancel` can stop it')),
    window: Type.Optional(
      Type.Integer({
        minimum: 64 * 1024,
        maximum: 64 * 1024 * 1024,
        description: "a streamed exec's flow control: the node sends at most this many output bytes past the caller's last exec.credit, then stops reading the command's output (which then waits on its pipe) until the next; absent: none",
        errorMessage: 'must be an integer from 65536 to 67108864',
      }),
    ),
    ...RolloutStep,
  },
  { $id: 'ExecRequest' },
);
export type ExecRequest = Omit<Static<typeof ExecRequest>, 'timeoutMs'> & { timeoutMs?: number };

export const ExecResult = Type.Object(
  {
    verdict: literals(ExecVerdicts),
    exitCode: Type.Integer(),
    signal: Type.Optional(Type.String({ description: 'set when a signal ended the process (exitCode is then 128 + its number)' })),
    stdout: Bytes('standard output (cut at maxOutputBytes)'),
    stderr: Bytes('standard error (cut at maxOutputBytes)'),
    durationMs: Type.Number(),
    truncated: Type.Boolean(),
    timedOut: Type.Boolean(),
    replayed: Type.Optional(Type.Boolean({ description: 'command log: the step was already recorded; this is its recorded result and nothing ran' })),
  },
  { $id: 'ExecResult' },
);
export type ExecResult = Static<typeof ExecResult>;

const ExitFields = { exitCode: Type.Integer(), signal: Type.Optional(Type.String()), durationMs: Type.Number(), truncated: Type.Boolean(), timedOut: Type.Boolean(), verdict: literals(ExecVerdicts) };
const Seq = Type.Optional(Count('sequence number of the event in its stream: 0, 1, 2, … (a missing one was lost: ask exec.resume)'));
/**
 * One message of a streamed exec, on the caller's inbox. `exit` is always last; `error` replaces it
 * on failure. `gap` stands for events the node no longer holds (a resume came too late).
 */
export const ExecEvent = Type.Union(
  [
    Type.Object({ t: Type.Literal('out'), d: Bytes('a chunk of stdout'), s: Seq }),
    Type.Object({ t: Type.Literal('err'), d: Bytes('a chunk of stderr'), s: Seq }),
    Type.Object({ t: Type.Literal('exit'), ...ExitFields, replayed: Type.Optional(Type.Boolean({ description: 'a rollout step recorded before: the output events were its recorded output, and nothing ran now' })), s: Seq }),
    Type.Object({ t: Type.Literal('error'), error: WireErrorSchema, s: Seq }),
    Type.Object({
      t: Type.Literal('gap'),
      s: Count('the first lost event'),
      n: Count('how many events were lost (s … s+n-1)'),
      bytes: Count('output bytes those events carried'),
    }),
  ],
  { $id: 'ExecEvent' },
);
export type ExecEvent = Static<typeof ExecEvent>;

export const ExecResumeRequest = Type.Object(
  {
    execId: Token('the execId the streamed exec was started with'),
    from: Count('the first event the caller has not seen'),
    offset: Type.Optional(Count('output bytes the caller has seen (sizes a gap)')),
  },
  { $id: 'ExecResumeRequest' },
);
export type ExecResumeRequest = Static<typeof ExecResumeRequest>;
/** Published (no reply) by the caller of a streamed exec with a \`window\`: it has taken this many output bytes so far. */
export const ExecCreditRequest = Type.Object(
  { execId: Token('the execId the streamed exec was started with'), received: Count('output bytes (stdout and stderr together) the caller has taken') },
  { $id: 'ExecCreditRequest', additionalProperties: false },
);
export type ExecCreditRequest = Static<typeof ExecCreditRequest>;
export const ExecResumeReply = Type.Object(
  {
    resent: Count('events sent again to the stream’s inbox (a gap counts as one)'),
    next: Count('the sequence number the next event will carry'),
    done: Type.Boolean({ description: 'the exec has ended (its exit or error event is among what the node holds)' }),
  },
  { $id: 'ExecResumeReply' },
);
export type ExecResumeReply = Static<typeof ExecResumeReply>;

export const ExecCancelRequest = Type.Object({ execId: Token('the execId the streamed exec was started with') }, { $id: 'ExecCancelRequest' });
export type ExecCancelRequest = Static<typeof ExecCancelRequest>;
export const ExecCancelReply = Type.Object({ cancelled: Type.Boolean({ description: 'false: no exec of that id runs (it ended, or never was)' }) }, { $id: 'ExecCancelReply' });

// ─── Processes (background commands and terminals) ──────────────────────────────────────────────

const ProcessStates = ['running', 'exited'] as const;
const Stream = literals(['out', 'err'] as const);
const TermSize = {
  cols: Type.Integer({ ...range(Limits.processes.cols), description: 'terminal width in characters' }),
  rows: Type.Integer({ ...range(Limits.processes.rows), description: 'terminal height in lines' }),
};

export const ProcessStartRequest = Type.Object(
  {
    cmd: Type.Optional(
      Type.Array(Type.String({ pattern: NO_NUL, errorMessage: 'every argument must be a string without NUL' }), {
        minItems: 1,
        maxItems: Limits.exec.argsMax,
        errorMessage: 'must be a non-empty array of strings',
        description: "argv (required without `pty`; with `pty` the default is the image's shell, `/bin/bash` if it has one, else `/bin/sh`, as a login shell)",
      }),
    ),
    cwd: Type.Optional(AbsPath('working directory (default: the spec’s, or the image’s)')),
    env: Type.Optional(Env),
    timeoutMs: Type.Optional(Type.Number({ ...range(Limits.exec.timeoutMs), description: "kill it (verdict TIMEOUT) after this long; absent: no timeout of its own, the sandbox's ttl bounds it" })),
    maxOutputBytes: Type.Optional(Type.Integer({ ...range(Limits.exec.maxOutputBytes), description: 'cap on stdout and on stderr, each, over its whole life (verdict OUTPUT_LIMIT); absent: none, only the newest `bufferBytes` are kept' })),
    bufferBytes: Type.Optional(Type.Integer({ ...range(Limits.processes.bufferBytes), description: `output kept on the node per stream for \`process.output\` (default ${Limits.processes.bufferBytes.default}); older bytes are dropped and counted` })),
    pty: Type.Optional(Type.Object(TermSize, { additionalProperties: false, description: 'run it on a pseudo-terminal of this size (stdout carries the terminal, stderr is unused)' })),
    tag: Type.Optional(Type.String({ maxLength: 256, description: 'free text shown in `process.list`' })),
  },
  { $id: 'ProcessStartRequest', additionalProperties: false, errorMessage: 'must be a map' },
);
export type ProcessStartRequest = Static<typeof ProcessStartRequest>;

/** A background process (or terminal) of a sandbox, as `process.*` verbs report it. */
export const ProcessInfo = Type.Object(
  {
    id: Type.String({ description: 'the process id in Paddock (`p1`, `p2`, …; never reused in a sandbox)' }),
    pid: Type.Optional(Type.Integer({ description: "its pid inside the sandbox, once known" })),
    cmd: Type.Array(Type.String()),
    tag: Type.Optional(Type.String()),
    pty: Type.Optional(Type.Object(TermSize)),
    state: literals(ProcessStates),
    startedAt: Ms('ms since the epoch'),
    endedAt: Type.Optional(Ms('ms since the epoch')),
    bytesOut: Count('stdout bytes it wrote, in all'),
    bytesErr: Count('stderr bytes it wrote, in all'),
    droppedOut: Count('stdout bytes no longer held (older than the newest `bufferBytes`)'),
    droppedErr: Count('stderr bytes no longer held'),
    bufferBytes: Type.Optional(Count('the output it keeps per stream (a holding reader’s window is at most half of it)')),
    exitCode: Type.Optional(Type.Integer()),
    signal: Type.Optional(Type.String({ description: 'the signal that ended it, if one did (exitCode is then 128 + its number)' })),
    durationMs: Type.Optional(Type.Number()),
    truncated: Type.Optional(Type.Boolean()),
    timedOut: Type.Optional(Type.Boolean()),
    verdict: Type.Optional(literals(ExecVerdicts)),
  },
  { $id: 'ProcessInfo', description: 'exitCode, signal, durationMs, truncated, timedOut and verdict are set once it has exited, as for exec' },
);
export type ProcessInfo = Static<typeof ProcessInfo>;
export const ProcessListReply = Type.Object({ processes: Type.Array(ProcessInfo, { description: 'oldest first: the running ones and the most recent that exited' }) }, { $id: 'ProcessListReply' });
export type ProcessListReply = Static<typeof ProcessListReply>;
const ProcessId = Token('the process id (`id` of its ProcessInfo)', 'must be a process id');
export const ProcessGetRequest = Type.Object({ id: ProcessId }, { $id: 'ProcessGetRequest' });
export const ProcessWaitRequest = Type.Object(
  { id: ProcessId, waitMs: Type.Integer({ minimum: 0, maximum: 60_000, default: 20_000, description: 'answer after this long if it still runs (then ask again)' }) },
  { $id: 'ProcessWaitRequest' },
);
export const ProcessKillRequest = Type.Object(
  { id: ProcessId, signal: Type.String({ pattern: '^SIG[A-Z0-9]{2,8}$', default: 'SIGKILL', errorMessage: 'must be a signal name such as SIGTERM', description: 'the signal; SIGKILL ends its whole process tree' }) },
  { $id: 'ProcessKillRequest' },
);
export const ProcessInputRequest = Type.Object(
  {
    id: ProcessId,
    data: Type.Optional(Bytes('bytes for its stdin (a terminal: what is typed)', Limits.processes.inputMax)),
    eof: Type.Optional(Type.Boolean({ description: 'close its stdin after `data`' })),
  },
  { $id: 'ProcessInputRequest' },
);
export const ProcessResizeRequest = Type.Object({ id: ProcessId, ...TermSize }, { $id: 'ProcessResizeRequest' });
export const ProcessOutputRequest = Type.Object(
  {
    id: ProcessId,
    out: Count('the stdout offset to start from (default 0: all that is held)'),
    err: Count('the stderr offset to start from'),
    follow: Type.Boolean({ default: true, description: 'keep sending as it comes until the exit (false: what is held now, then `end`)' }),
    readerId: Type.Optional(Token('names this reader so that `process.output.cancel` can stop it (and, with `window`, `process.output.credit` credit it)')),
    window: Type.Optional(
      Type.Integer({
        ...range(Limits.processes.window),
        description:
          'a holding reader (follow, with a readerId): the node sends it at most this many bytes (stdout and stderr together) past its last `process.output.credit` and leaves the process’s output unread meanwhile, so the process waits on its pipe; at most half the process’s `bufferBytes`; absent: the process never waits for this reader, which gets a `gap` for what its buffer dropped',
      }),
    ),
    stallMs: Type.Optional(Type.Integer({ ...range(Limits.processes.stallMs), description: `a holding reader that credits nothing for this long while the process waits on it is let go with CANCELLED, and the process goes on (default ${Limits.processes.stallMs.default / 1000} s)` })),
  },
  { $id: 'ProcessOutputRequest' },
);
/** Published (no reply) by a holding reader: it has every byte before these offsets. */
export const ProcessOutputCreditRequest = Type.Object(
  { id: ProcessId, readerId: Token('the readerId of the holding `process.output`'), out: Count('the stdout offset it has read up to'), err: Count('the stderr offset it has read up to') },
  { $id: 'ProcessOutputCreditRequest', additionalProperties: false },
);
export const ProcessOutputCancelRequest = Type.Object({ id: ProcessId, readerId: Token('the readerId of the `process.output` to stop') }, { $id: 'ProcessOutputCancelRequest' });
export const ProcessOutputCancelReply = Type.Object({ cancelled: Type.Boolean() }, { $id: 'ProcessOutputCancelReply' });
/**
 * One message of `process.output`, on the caller's inbox. Every chunk carries the offset of its
 * first byte in its stream; `gap` says bytes from `o` on were dropped before this reader got them.
 * `exit` (the process has ended and everything held was sent) or `end` (follow: false) is last.
 */
export const ProcessEvent = Type.Union(
  [
    Type.Object({ t: Type.Literal('out'), d: Bytes('a chunk of stdout (of the terminal, for a pty)'), o: Count('its offset in stdout') }),
    Type.Object({ t: Type.Literal('err'), d: Bytes('a chunk of stderr'), o: Count('its offset in stderr') }),
    Type.Object({ t: Type.Literal('gap'), stream: Stream, o: Count('the first byte lost'), bytes: Count('how many bytes were lost') }),
    Type.Object({ t: Type.Literal('exit'), ...ExitFields }),
    Type.Object({ t: Type.Literal('end'), out: Count('the next stdout offset'), err: Count('the next stderr offset') }),
    Type.Object({ t: Type.Literal('error'), error: WireErrorSchema }),
  ],
  { $id: 'ProcessEvent' },
);
export type ProcessEvent = Static<typeof ProcessEvent>;

// ─── Files ──────────────────────────────────────────────────────────────────────────────────────

export const FilesReadRequest = Type.Object(
  { path: SandboxPath, offset: Type.Optional(Count('where to start')), length: Type.Optional(Count(`how much to read (at most ${Limits.files.chunkMax} per call)`)) },
  { $id: 'FilesReadRequest' },
);
export type FilesReadRequest = Static<typeof FilesReadRequest>;
export const FilesReadReply = Type.Object({ data: Bytes('the bytes read'), size: Type.Integer({ description: 'size of the whole file' }), eof: Type.Boolean() }, { $id: 'FilesReadReply' });
export type FilesReadReply = Static<typeof FilesReadReply>;

export const FilesWriteRequest = Type.Object(
  {
    path: SandboxPath,
    data: Bytes('the bytes to write', Limits.files.chunkMax),
    offset: Type.Optional(Count('write here without truncating (chunked uploads); absent: replace the file')),
    mode: Type.Optional(Count('permission bits', 0o7777)),
    ...RolloutStep,
  },
  { $id: 'FilesWriteRequest' },
);
export type FilesWriteRequest = Static<typeof FilesWriteRequest>;
export const FilesWriteReply = Type.Object({ size: Type.Integer(), replayed: Type.Optional(Type.Boolean({ description: 'command log: the step was already recorded; nothing was written' })) }, { $id: 'FilesWriteReply' });
export type FilesWriteReply = Static<typeof FilesWriteReply>;

export const FilesListRequest = Type.Object({ path: SandboxPath }, { $id: 'FilesListRequest' });
export type FilesListRequest = Static<typeof FilesListRequest>;
export const FileTypes = ['file', 'dir', 'symlink', 'other'] as const;
export type FileType = (typeof FileTypes)[number];
export const FileEntry = Type.Object({
  name: Type.String({ description: 'the name as text; a name that is not valid UTF-8 has U+FFFD where its bad bytes are (see nameBytes)' }),
  nameBytes: Type.Optional(Bytes('the name exactly, set when it is not valid UTF-8: file names are bytes')),
  type: literals(FileTypes), size: Type.Number(), mode: Type.Integer(), mtimeMs: Type.Number() }, { $id: 'FileEntry' });
export type FileEntry = Static<typeof FileEntry>;
export const FilesListReply = Type.Object({ entries: Type.Array(FileEntry) }, { $id: 'FilesListReply' });
export type FilesListReply = Static<typeof FilesListReply>;
export const FilesRemoveRequest = Type.Object({ path: SandboxPath, recursive: Type.Optional(Type.Boolean()) }, { $id: 'FilesRemoveRequest' });
export type FilesRemoveRequest = Static<typeof FilesRemoveRequest>;

// Directory trees move as tar archives, in chunks of at most chunkMax, each one a request and its
// reply: the caller sends (or asks for) the next chunk only once the node has answered the last,
// so neither side holds more than a chunk and the node's event loop sets the pace.
export const FilesUploadRequest = Type.Object(
  {
    uploadId: Token('names the upload; every chunk of it carries the same id'),
    path: SandboxPath,
    seq: Count('the chunk’s number: 0, 1, 2, … (a chunk sent again after a lost reply is answered again, not written twice)'),
    data: Bytes('the next bytes of the tar archive', Limits.files.chunkMax),
    end: Type.Optional(Type.Boolean({ description: 'the last chunk: the archive must be complete here' })),
  },
  { $id: 'FilesUploadRequest' },
);
export type FilesUploadRequest = Static<typeof FilesUploadRequest>;
export const FilesUploadReply = Type.Object(
  {
    entries: Count('entries written so far (files, directories, symlinks)'),
    bytes: Count('file bytes written so far'),
    done: Type.Boolean({ description: 'the archive is complete and every entry of it written' }),
  },
  { $id: 'FilesUploadReply' },
);
export type FilesUploadReply = Static<typeof FilesUploadReply>;

export const FilesDownloadRequest = Type.Object(
  {
    downloadId: Token('names the download; every pull of it carries the same id'),
    path: SandboxPath,
    seq: Count('the chunk wanted: 0, 1, 2, … (asking for the last one again gets it again)'),
    cancel: Type.Optional(Type.Boolean({ description: 'the caller stops here: the node drops the download' })),
  },
  { $id: 'FilesDownloadRequest' },
);
export type FilesDownloadRequest = Static<typeof FilesDownloadRequest>;
export const FilesDownloadReply = Type.Object(
  { data: Bytes('the next bytes of the tar archive'), eof: Type.Boolean({ description: 'the archive ends with these bytes' }) },
  { $id: 'FilesDownloadReply' },
);
export type FilesDownloadReply = Static<typeof FilesDownloadReply>;

export const FileChanges = ['created', 'modified', 'removed'] as const;
export type FileChange = (typeof FileChanges)[number];
export const FilesWatchRequest = Type.Object(
  {
    watchId: Token('names the watch (for renew and cancel)'),
    path: SandboxPath,
    recursive: Type.Optional(Type.Boolean({ description: 'also every directory below (made later ones included)' })),
  },
  { $id: 'FilesWatchRequest' },
);
export type FilesWatchRequest = Static<typeof FilesWatchRequest>;
/** What a watch sends to the caller's inbox: `ready` first, then changes, then `end` (or `error`). */
export const FileWatchEvent = Type.Union(
  [
    Type.Object({ t: Type.Literal('ready'), s: Count('sequence number') }),
    Type.Object({
      t: Type.Literal('change'),
      s: Count('sequence number'),
      type: literals(FileChanges),
      path: Type.String({ description: 'absolute path inside the sandbox; a name that is not valid UTF-8 has U+FFFD where its bad bytes are (see pathBytes)' }),
      pathBytes: Type.Optional(Bytes('the path exactly, set when it is not valid UTF-8')),
    }),
    Type.Object({ t: Type.Literal('end'), s: Count('sequence number'), reason: Type.String({ description: 'why the watch ended: cancelled, expired, removed (the watched directory), sandbox_ended' }) }),
    Type.Object({ t: Type.Literal('error'), s: Count('sequence number'), error: WireErrorSchema }),
  ],
  { $id: 'FileWatchEvent' },
);
export type FileWatchEvent = Static<typeof FileWatchEvent>;
export const FilesWatchLeaseRequest = Type.Object({ watchId: Token('the watch’s id') }, { $id: 'FilesWatchLeaseRequest' });
export type FilesWatchLeaseRequest = Static<typeof FilesWatchLeaseRequest>;
export const FilesWatchLeaseReply = Type.Object(
  { watching: Type.Boolean({ description: 'false: no such watch (it ended, expired, or never was)' }), leaseMs: Count('the watch ends this long after its last renewal') },
  { $id: 'FilesWatchLeaseReply' },
);
export type FilesWatchLeaseReply = Static<typeof FilesWatchLeaseReply>;

// ─── Display (full VMs) ──────────────────────────────────────────────────────────────────────────

/** The computer-use action set, with the argument names computer-use harnesses send. */
export const ComputerActions = [
  'screenshot',
  'left_click',
  'right_click',
  'middle_click',
  'double_click',
  'triple_click',
  'mouse_move',
  'left_click_drag',
  'left_mouse_down',
  'left_mouse_up',
  'scroll',
  'type',
  'key',
  'hold_key',
  'wait',
  'cursor_position',
] as const;
export type ComputerActionName = (typeof ComputerActions)[number];

const Point = (description: string) =>
  Type.Tuple([Type.Integer({ minimum: 0, maximum: Limits.display.widthMax }), Type.Integer({ minimum: 0, maximum: Limits.display.heightMax })], { description, errorMessage: 'must be [x, y], whole pixels on the screen' });

export const ComputerAction = Type.Object(
  {
    action: literals(ComputerActions, { errorMessage: `unknown action {value}; known: ${ComputerActions.join(', ')}` }),
    coordinate: Type.Optional(Point('where: [x, y] in pixels from the top left')),
    start_coordinate: Type.Optional(Point('left_click_drag: where the drag starts (absent: where the pointer is)')),
    text: Type.Optional(Type.String({ maxLength: Limits.display.typeMax, errorCode: 'PAYLOAD_TOO_LARGE' satisfies ErrorCode, description: `type: the text (≤ ${Limits.display.typeMax} characters, US keyboard); key, hold_key: keys as xdotool names them, e.g. \`ctrl+l\`, \`Return\`; clicks and scroll: modifiers held meanwhile` })),
    scroll_direction: Type.Optional(literals(['up', 'down', 'left', 'right'] as const)),
    scroll_amount: Type.Optional(Type.Integer({ minimum: 1, maximum: Limits.display.scrollMax, description: 'scroll: wheel clicks (default 3)' })),
    duration: Type.Optional(Type.Number({ minimum: 0, maximum: Limits.display.durationMaxSec, description: 'wait, hold_key: seconds' })),
    screenshot: Type.Optional(Type.Boolean({ description: 'also return a screenshot taken after the action (always for `screenshot`)' })),
  },
  { $id: 'ComputerAction', additionalProperties: false, errorMessage: 'must be a map' },
);
export type ComputerAction = Static<typeof ComputerAction>;

export const Screenshot = Type.Object(
  {
    png: Type.Uint8Array({ description: 'the screen as a PNG' }),
    width: Type.Integer(),
    height: Type.Integer(),
  },
  { $id: 'Screenshot' },
);
export type Screenshot = Static<typeof Screenshot>;

export const DisplayViewRequest = Type.Object(
  { control: Type.Optional(Type.Boolean({ description: 'let the viewer type and click (default: view only; the node drops their input)' })) },
  { $id: 'DisplayViewRequest', additionalProperties: false },
);
export const DisplayViewReply = Type.Object(
  {
    url: Type.String({ description: "a page on the node's loopback that shows the screen live (noVNC); `<url>/ws` is the RFB WebSocket" }),
    control: Type.Boolean(),
  },
  { $id: 'DisplayViewReply' },
);
export type DisplayViewReply = Static<typeof DisplayViewReply>;

// ─── Ports: connections to TCP ports inside a sandbox, from the node's side ─────────────────

const Port = Type.Integer({ minimum: 1, maximum: 65535, description: "a TCP port on the sandbox's loopback (127.0.0.1, else ::1)", errorMessage: 'must be an integer from 1 to 65535' });
const ConnId = Token('the connection, as ports.connect named it');
export const PortsConnectRequest = Type.Object(
  {
    port: Port,
    window: Type.Optional(
      Type.Integer({
        minimum: 64 * 1024,
        maximum: 64 * 1024 * 1024,
        description: "flow control towards the caller: the node sends at most this many bytes past the caller's last ports.credit, then stops reading the server (which then waits, as on a slow TCP peer); absent: none",
        errorMessage: 'must be an integer from 65536 to 67108864',
      }),
    ),
  },
  { $id: 'PortsConnectRequest', additionalProperties: false },
);
export type PortsConnectRequest = Static<typeof PortsConnectRequest>;
/** Published (no reply) by a caller that asked for a \`window\`: it has taken this many of the connection's bytes so far. */
export const PortsCreditRequest = Type.Object(
  { connId: ConnId, received: Type.Integer({ minimum: 0, description: 'bytes of the connection the caller has taken, counted from its open' }) },
  { $id: 'PortsCreditRequest', additionalProperties: false },
);
export type PortsCreditRequest = Static<typeof PortsCreditRequest>;
/**
 * One message of a port connection, on the caller's inbox: `open` first (its connId for
 * ports.send and ports.close), then the bytes the server sends, then `end` (the server closed, or
 * the connection was closed) or `error`.
 */
export const PortEvent = Type.Union(
  [
    Type.Object({ t: Type.Literal('open'), connId: ConnId }),
    Type.Object({ t: Type.Literal('d'), d: Bytes('bytes the server sent') }),
    Type.Object({ t: Type.Literal('end') }),
    Type.Object({ t: Type.Literal('error'), error: WireErrorSchema }),
  ],
  { $id: 'PortEvent' },
);
export type PortEvent = Static<typeof PortEvent>;
export const PortsSendRequest = Type.Object(
  {
    connId: ConnId,
    d: Type.Optional(Bytes('bytes for the server', Limits.files.chunkMax)),
    end: Type.Optional(Type.Boolean({ description: 'nothing more will be sent: the server reads end of file (it may still answer)' })),
  },
  { $id: 'PortsSendRequest', additionalProperties: false },
);
export type PortsSendRequest = Static<typeof PortsSendRequest>;
export const PortsCloseRequest = Type.Object({ connId: ConnId }, { $id: 'PortsCloseRequest', additionalProperties: false });
export type PortsCloseRequest = Static<typeof PortsCloseRequest>;
export const PortsCloseReply = Type.Object({ closed: Type.Boolean({ description: 'false: no connection of that id is open (it ended, or never was)' }) }, { $id: 'PortsCloseReply' });
export type PortsCloseReply = Static<typeof PortsCloseReply>;
export const PortsUrlRequest = Type.Object({ port: Port }, { $id: 'PortsUrlRequest', additionalProperties: false });
export type PortsUrlRequest = Static<typeof PortsUrlRequest>;
export const PortsUrlReply = Type.Object(
  {
    url: Type.String({ description: "`http://127.0.0.1:<p>/` on the node's loopback: every TCP connection to it is a connection to the port inside" }),
    port: Type.Integer(),
  },
  { $id: 'PortsUrlReply' },
);
export type PortsUrlReply = Static<typeof PortsUrlReply>;

export const ComputerReply = Type.Object(
  {
    cursor: Type.Object({ x: Type.Integer(), y: Type.Integer() }, { description: 'where the pointer is after the action' }),
    screenshot: Type.Optional(Screenshot),
  },
  { $id: 'ComputerReply' },
);
export type ComputerReply = Static<typeof ComputerReply>;

export const NetworkSetRequest = Type.Object({ policy: Type.Optional(NetworkPolicy) }, { $id: 'NetworkSetRequest' });
export const NetworkSetReply = Type.Object({ policy: NetworkPolicy }, { $id: 'NetworkSetReply' });

// ─── Snapshots (microVMs and full VMs: whole state; containers: files) ─────────────────────────────────────────────────────────────

/** A saved state of a running sandbox (a VM's whole state on its node's disk; a container's files as a layer in the image store), kept until deleted: new sandboxes start from it (`spec.fromSnapshot`). */
export const SnapshotInfo = Type.Object(
  {
    id: Type.String({ description: 'the snapshot id: `spec.fromSnapshot` of a create' }),
    node: Type.String({ description: 'the node that took it: sandboxes made from a VM snapshot run there unless its state is in the image store, from a container snapshot on any node reading the same image store' }),
    backend: literals(Backends),
    image: Type.String(),
    toolkit: Type.Optional(Type.String()),
    workspace: Type.Optional(Type.String()),
    memoryMiB: Type.Number(),
    cpu: Type.Number({ description: 'the CPUs of the sandbox it was taken of (a sandbox made from a VM snapshot has as many; from a container snapshot, as many unless the create says)' }),
    diskMiB: Type.Number({ description: 'the writable layer of the sandbox it was taken of' }),
    display: Type.Optional(DisplaySpec),
    from: Type.String({ description: 'the sandbox it was taken of (it may have ended since)' }),
    bytes: Type.Integer({ minimum: 0, description: 'its size: the VM state on the node’s disk, or the container layer in the store' }),
    createdAt: Ms('ms since the epoch'),
    state: Type.Optional(
      Type.Object(
        {
          digest: Type.String({ description: 'sha256:<hex> of the state file, a blob in the image store' }),
          size: Type.Integer({ minimum: 0 }),
          machine: Type.String({ description: 'the machine it loads into: its kernel, agent, devices, memory, CPUs and layers (a node whose template of the spec differs refuses it)' }),
        },
        { description: "a VM snapshot's state copied into the image store: any node reading that store (of the same machine) starts sandboxes from it, and a migratable VM moves through it" },
      ),
    ),
  },
  { $id: 'SnapshotInfo' },
);
export type SnapshotInfo = Static<typeof SnapshotInfo>;

export const ForkRequest = Type.Object(
  {
    count: Type.Integer({ minimum: 1, maximum: Limits.fork.max, default: 1, description: 'how many copies', errorMessage: `must be an integer from 1 to ${Limits.fork.max}` }),
    labels: Type.Optional(labelsOf({ description: 'labels of the copies (default: the parent’s)' })),
    group: Type.Optional(Token('the training job of the copies (default: the parent’s)')),
    ttlSec: Type.Optional(Type.Number({ ...range(Limits.ttlSec), description: 'lifetime of the copies (default: the parent’s ttlSec)' })),
  },
  { $id: 'ForkRequest', additionalProperties: false, errorMessage: 'must be a map' },
);
export type ForkRequest = { count?: number; labels?: Record<string, string>; group?: string; ttlSec?: number };
export const ForkReply = Type.Object({ sandboxes: Type.Array(SandboxInfo, { description: 'the copies, running' }) }, { $id: 'ForkReply' });
export type ForkReply = Static<typeof ForkReply>;

export const SnapshotsListRequest = Type.Object(
  { node: Type.Optional(Token('only snapshots on this node')), from: Type.Optional(Token('only snapshots of this sandbox')) },
  { $id: 'SnapshotsListRequest' },
);
export type SnapshotsListRequest = Static<typeof SnapshotsListRequest>;
export const SnapshotsListReply = Type.Object({ snapshots: Type.Array(SnapshotInfo, { description: 'oldest first' }) }, { $id: 'SnapshotsListReply' });
export type SnapshotsListReply = Static<typeof SnapshotsListReply>;
export const SnapshotsDeleteRequest = Type.Object({ id: Token('the snapshot') }, { $id: 'SnapshotsDeleteRequest' });
export const SnapshotsDeleteReply = Type.Object({ deleted: Type.Boolean({ description: 'false: there was no such snapshot (deleting is idempotent)' }) }, { $id: 'SnapshotsDeleteReply' });
export type SnapshotsDeleteReply = Static<typeof SnapshotsDeleteReply>;

// ─── Groups ─────────────────────────────────────────────────────────────────────────────────────

const GroupFailure = Type.Object({ id: Type.String(), node: Type.String(), code: Type.String(), message: Type.String() });
/** What a group verb did, summed over every node (`pdk.v1.group.<g>.<verb>`). */
export const GroupReply = Type.Object(
  {
    group: Type.String(),
    verb: literals(GroupVerbs),
    total: Type.Integer({ description: 'sandboxes of the group found on live nodes' }),
    ok: Type.Integer(),
    failed: Type.Array(GroupFailure),
    unreachable: Type.Array(Type.String(), { description: 'nodes that did not answer in time: their sandboxes are not counted' }),
    releasedBytes: Type.Integer({ minimum: 0, description: 'hibernate: the memory the sandboxes gave back to their nodes, in bytes (0 for the other verbs)' }),
    durationMs: Type.Number(),
  },
  { $id: 'GroupReply' },
);
export type GroupReply = Static<typeof GroupReply>;
/** A node's part of a group verb (`pdk.v1.node.<node>.group`). */
export const NodeGroupRequest = Type.Object({ group: Token('the training job'), verb: literals(GroupVerbs, { errorCode: 'UNKNOWN_VERB' satisfies ErrorCode, errorMessage: `unknown group verb {value}; known: ${GroupVerbs.join(', ')}` }) }, { $id: 'NodeGroupRequest' });
export type NodeGroupRequest = Static<typeof NodeGroupRequest>;

// ─── Directory (list and get, served by placement replicas) ─────────────────────────────────────

export const SandboxesListRequest = Type.Object(
  {
    labels: Type.Optional(Type.Record(Type.String(), Type.String(), { description: 'every label given must match' })),
    group: Type.Optional(Token('only this training job')),
    state: Type.Optional(Type.Array(literals(SandboxStates), { description: 'only these states (default: creating, running, stopping — or every state with `all`)' })),
    node: Type.Optional(Token('only sandboxes on this node')),
    backend: Type.Optional(literals(Backends)),
    all: Type.Optional(Type.Boolean({ description: 'include sandboxes that have ended, and sleeping ones (default: only live ones)' })),
    limit: Type.Integer({ minimum: 1, maximum: Limits.list.max, default: Limits.list.default, description: 'page size' }),
    cursor: Type.Optional(Type.String({ maxLength: 256, description: 'the `next` of the previous page' })),
  },
  { $id: 'SandboxesListRequest' },
);
export type SandboxesListRequest = Partial<Static<typeof SandboxesListRequest>>;
export const SandboxesListReply = Type.Object(
  { sandboxes: Type.Array(SandboxInfo, { description: 'oldest first' }), next: Type.Optional(Type.String({ description: 'pass as `cursor` for the next page; absent on the last' })) },
  { $id: 'SandboxesListReply' },
);
export type SandboxesListReply = Static<typeof SandboxesListReply>;
export const SandboxesGetRequest = Type.Object({ id: Token('the sandbox id') }, { $id: 'SandboxesGetRequest' });
/** Which of a client's creates in flight a placement replica still holds (the SDK's liveness probe of its creates). */
export const PlacePendingRequest = Type.Object({ ids: Type.Array(Token('a sandbox id the caller is creating'), { minItems: 1, maxItems: 1000 }) }, { $id: 'PlacePendingRequest' });
export type PlacePendingRequest = Static<typeof PlacePendingRequest>;
export const PlacePendingReply = Type.Object(
  {
    held: Type.Array(
      Type.Object({ id: Type.String(), node: Type.Optional(Type.String({ description: 'the node asked to make it, once one is' })), sinceMs: Type.Integer({ description: 'how long this replica has held it' }) }),
      { description: 'those of the ids this replica is placing; a replica holding none stays silent' },
    ),
  },
  { $id: 'PlacePendingReply' },
);
export type PlacePendingReply = Static<typeof PlacePendingReply>;

// ─── Rollouts (the command log) ─────────────────────────────────────────────────────────────────

/** A rollout in the `pdk_rollouts` bucket: which sandbox it drives and how long its log is kept. */
export const RolloutRecord = Type.Object(
  {
    v: Type.Literal(1),
    rolloutId: Type.String(),
    sandbox: Type.String(),
    createdAt: Ms('ms since the epoch'),
    touchedAt: Ms('last start or attach (ms since the epoch)'),
    retentionSec: Type.Number({ description: "the log is deleted this long after the rollout's last record (or last attach, if later)" }),
  },
  { $id: 'RolloutRecord' },
);
export type RolloutRecord = Static<typeof RolloutRecord>;

export const RolloutsStartRequest = Type.Object(
  {
    rolloutId: Type.Optional(Token('default: a new `ro-…` id')),
    sandbox: Type.Optional(Type.Unsafe<Partial<SandboxSpec>>(Type.Ref('SandboxSpec'))),
    retentionSec: Type.Number({ exclusiveMinimum: 0, default: Limits.rollout.retentionSec.default, description: 'keep the log this long after its last record or attach (capped by the node’s PADDOCK_CHRONUS_MAX_AGE_SEC)' }),
  },
  { $id: 'RolloutsStartRequest' },
);
export type RolloutsStartRequest = { rolloutId?: string; sandbox?: Partial<SandboxSpec>; retentionSec?: number };

const StepRecordLoose = Type.Record(Type.String(), Type.Unknown(), { description: 'a command-log record (`kind` started or result; see chronus/record.ts)' });
export const RolloutsAttachRequest = Type.Object(
  { rolloutId: Token('the rollout'), prefetch: Type.Optional(Type.Boolean({ description: 'also return the recorded steps (first page), so replayed steps need no round trip' })) },
  { $id: 'RolloutsAttachRequest' },
);
export const RolloutView = Type.Object(
  {
    rollout: RolloutRecord,
    sandbox: SandboxInfo,
    lastStep: Type.Integer({ description: 'the highest step recorded (-1: none)' }),
    steps: Type.Optional(Type.Array(StepRecordLoose, { description: 'with prefetch: the last record of each step, ascending' })),
    next: Type.Optional(Type.Integer({ description: 'more steps follow: ask `rollouts.steps` with `after` = this' })),
  },
  { $id: 'RolloutView' },
);
export type RolloutView<R = Record<string, unknown>> = Omit<Static<typeof RolloutView>, 'steps'> & { steps?: R[] };
export const RolloutsGetRequest = Type.Object({ rolloutId: Token('the rollout') }, { $id: 'RolloutsGetRequest' });
export const RolloutsStepsRequest = Type.Object(
  {
    rolloutId: Token('the rollout'),
    which: literals(['last', 'all'] as const, { default: 'last', description: '`last`: where each step stands; `all`: every record' }),
    after: Type.Integer({ minimum: -1, default: -1, description: 'only steps above this one' }),
  },
  { $id: 'RolloutsStepsRequest' },
);
export const RolloutsStepsReply = Type.Object(
  { records: Type.Array(StepRecordLoose), next: Type.Optional(Type.Integer({ description: 'more follow: ask again with `after` = this' })) },
  { $id: 'RolloutsStepsReply' },
);
export type RolloutsStepsReply<R = Record<string, unknown>> = { records: R[]; next?: number };
export const RolloutsExportReply = Type.Object(
  { lines: Type.Array(Type.String(), { description: 'one JSON object per step (the trajectory line)' }), next: Type.Optional(Type.Integer()) },
  { $id: 'RolloutsExportReply' },
);
export const RolloutsExportRequest = Type.Object({ rolloutId: Token('the rollout'), after: Type.Integer({ minimum: -1, default: -1, description: 'only steps above this one' }) }, { $id: 'RolloutsExportRequest' });
export const RolloutsDeleteRequest = Type.Object({ rolloutId: Token('the rollout'), kill: Type.Optional(Type.Boolean({ description: 'kill its sandbox too' })) }, { $id: 'RolloutsDeleteRequest' });
export const RolloutsDeleteReply = Type.Object({ purged: Type.Integer({ description: 'records deleted' }) }, { $id: 'RolloutsDeleteReply' });

// ─── FnCall ─────────────────────────────────────────────────────────────────────────────────────

export const FnLimits = Type.Object(
  {
    timeMs: Type.Number({ ...range(Limits.fn.timeMs), default: Limits.fn.timeMs.default, description: "CPU time of the program's whole process tree" }),
    wallMs: Type.Optional(Type.Number({ ...range(Limits.fn.wallMs), description: 'wall-clock cap; default 2 × timeMs + 200' })),
    memoryMiB: Type.Integer({ ...range(Limits.fn.memoryMiB), default: Limits.fn.memoryMiB.default }),
    outputBytes: Type.Integer({ ...range(Limits.fn.outputBytes), default: Limits.fn.outputBytes.default, description: 'cap on stdout + stderr together (OUTPUT_LIMIT past it)' }),
  },
  { $id: 'FnLimits', additionalProperties: false, default: {} },
);
export type FnLimits = Required<Static<typeof FnLimits>>;

export const FnTest = Type.Object(
  { stdin: Type.Optional(TextOrBytes('this test’s stdin')), expected: Type.Optional(TextOrBytes('what stdout must be (per `compare`); absent: only the exit status is judged')) },
  { additionalProperties: false },
);
export type FnTest = Static<typeof FnTest>;

export const FnInvokeRequest = Type.Object(
  {
    language: Type.Optional(literals(FnLanguages, { errorCode: 'INVALID_SPEC' satisfies ErrorCode, errorMessage: `unknown language {value}; known: ${FnLanguages.join(', ')}`, description: 'a language (its code is compiled if needed, then run), or `image` + `command`' })),
    image: Type.Optional(ImageName('an image to run `command` in')),
    command: Type.Optional(Type.Array(Type.String({ pattern: NO_NUL }), { maxItems: Limits.exec.argsMax, description: 'with `image`: the argv to run in /work (`code`, if given, is at /box/main)', errorMessage: `must be an array of at most ${Limits.exec.argsMax} strings without NUL` })),
    code: Type.Optional(TextOrBytes('the program')),
    files: Type.Optional(
      Type.Record(Type.String(), TextOrBytes('contents'), { maxProperties: Limits.fn.files, description: 'files put in /work before every run: relative path → contents', errorMessage: 'must be a map of relative path to contents' }),
    ),
    stdin: Type.Optional(TextOrBytes('standard input (judge mode: each test has its own)')),
    args: Type.Optional(Type.Array(Type.String({ pattern: NO_NUL }), { maxItems: Limits.fn.args, description: 'arguments after the program', errorMessage: `must be an array of at most ${Limits.fn.args} strings without NUL` })),
    env: Type.Optional(Env),
    limits: FnLimits,
    tests: Type.Optional(Type.Array(FnTest, { minItems: 1, maxItems: Limits.fn.tests, description: 'judge mode: one run per test', errorMessage: `must be an array of 1 to ${Limits.fn.tests} tests` })),
    compare: literals(FnCompareModes, { default: 'lines', errorMessage: `must be one of ${FnCompareModes.join(', ')}` }),
    stopOnFailure: Type.Boolean({ default: false, description: 'skip the tests after the first that fails (they report nothing)' }),
  },
  { $id: 'FnInvokeRequest', additionalProperties: false },
);
/** What a caller sends: everything with a default may be left out. */
export type FnInvokeRequest = Omit<Static<typeof FnInvokeRequest>, 'limits' | 'compare' | 'stopOnFailure'> & { limits?: Partial<FnLimits>; compare?: FnCompareMode; stopOnFailure?: boolean };

const FnRunFields = {
  verdict: literals(FnVerdicts),
  exitCode: Type.Integer(),
  signal: Type.Optional(Type.String({ description: 'the signal that ended the program, if one did' })),
  stdout: Bytes('standard output'),
  stderr: Bytes('standard error'),
  timeMs: Type.Number({ description: 'CPU time of the program (user + system)' }),
  wallMs: Type.Number(),
  memoryBytes: Type.Number({ description: 'peak resident memory of the program' }),
  reason: Type.Optional(Type.String({ description: 'why a verdict other than OK and WRONG_ANSWER came about, in words' })),
};
export const FnRunResult = Type.Object(FnRunFields, { $id: 'FnRunResult' });
export type FnRunResult = Static<typeof FnRunResult>;
/** One test of a judged invocation; stdout and stderr are cut to a preview (`outputCut`). */
export const FnTestResult = Type.Object({ ...FnRunFields, outputCut: Type.Optional(Type.Boolean()) }, { $id: 'FnTestResult' });
export type FnTestResult = Static<typeof FnTestResult>;
export const FnInvokeResult = Type.Object(
  {
    ...FnRunFields,
    compileOutput: Type.Optional(Bytes("the compiler's output (errors for COMPILE_ERROR, else its warnings)")),
    tests: Type.Optional(Type.Array(FnTestResult)),
    passed: Type.Optional(Type.Integer({ description: 'tests that passed, of `tests.length`' })),
    node: Type.String(),
    queuedMs: Type.Number({ description: 'time the request waited for a free pool member' }),
  },
  { $id: 'FnInvokeResult' },
);
export type FnInvokeResult = Static<typeof FnInvokeResult>;

/** CPU, memory, sandboxes and (when counted) pids and writable-layer MiB: a node's capacity or what is allocated from it. */
export const Resources = Type.Object(
  {
    cpu: Type.Number({ description: 'CPUs (overcommitted: cores × the node\'s CPU overcommit)' }),
    memoryMiB: Type.Number(),
    sandboxes: Type.Integer({ minimum: 0 }),
    pids: Type.Optional(Type.Integer({ minimum: 0, description: "processes (the specs' pidsLimit): the host's pid_max is one table for every sandbox; absent = not counted" })),
    diskMiB: Type.Optional(Type.Number({ description: "writable layers (the specs' diskMiB, which the container backend keeps in RAM); absent = not counted" })),
  },
  { $id: 'Resources' },
);
export type Resources = Static<typeof Resources>;
/** One backend kind's own pool on a node. */
export const BackendOffer = Type.Object({ capacity: Resources, allocated: Resources }, { $id: 'BackendOffer' });
export type BackendOffer = Static<typeof BackendOffer>;
export const NodeStates = ['serving', 'draining'] as const;
/** A node's heartbeat in the `pdk_nodes` bucket, and what `nodes.list`, `drain` and `undrain` answer with. */
export const NodeRecord = Type.Object(
  {
    node: Type.String(),
    backends: Type.Array(literals(Backends)),
    images: Type.Array(Type.String()),
    capacity: Resources,
    allocated: Resources,
    sandboxes: Type.Integer({ minimum: 0, description: 'sandboxes live on the node' }),
    migratable: Type.Optional(Type.Integer({ minimum: 0, description: 'of `sandboxes`, those created `migratable`: a drain with `migrate` moves them to other nodes' })),
    heartbeatMs: Type.Number({ description: 'heartbeat period; a record older than 3 periods is dead' }),
    ts: Type.Number({ description: 'when the record was written (ms since the epoch)' }),
    state: literals(NodeStates),
    offers: Type.Optional(Type.Partial(Type.Record(literals(Backends), BackendOffer), { description: 'per backend kind this node offers: its own pool; `capacity` and `allocated` are their sums' })),
    store: Type.Optional(Type.String({ description: 'the layer store this node reads from (and, when it embeds it, serves): an http:// base URL' })),
    home: Type.Optional(Type.String({ description: "the node's PADDOCK_HOME on its host (its logs are in `<home>/logs/`)" })),
    placement: Type.Optional(Type.Boolean({ description: 'whether this node process also runs a placement replica' })),
    fn: Type.Optional(Type.Object({ languages: Type.Array(literals(FnLanguages)), running: Type.Integer(), queued: Type.Integer() }, { description: 'FnCall on this node: the languages it has images for, and its load' })),
    lostAt: Type.Optional(Type.Number({ description: 'set by the placement replica that found the node silent and marked its sandboxes `node_lost`; gone with its next heartbeat' })),
  },
  { $id: 'NodeRecord' },
);
export type NodeRecord = Static<typeof NodeRecord>;
/** `node.<node>.drain`: cordon the node, and with `migrate` move its migratable sandboxes elsewhere. */
export const DrainRequest = Type.Object(
  { migrate: Type.Optional(Type.Boolean({ description: 'move every sandbox created with `migratable` to another node before answering; the others run on' })) },
  { $id: 'DrainRequest', additionalProperties: false },
);
export type DrainRequest = Static<typeof DrainRequest>;
export const DrainReply = Type.Intersect(
  [
    NodeRecord,
    Type.Object({
      migrated: Type.Optional(Type.Record(Type.String(), Type.String(), { description: 'with `migrate`: old sandbox id → the id it goes on as' })),
      notMigrated: Type.Optional(Type.Record(Type.String(), Type.String(), { description: 'with `migrate`: migratable sandboxes that stayed, and why (they run on here)' })),
    }),
  ],
  { $id: 'DrainReply' },
);
export type DrainReply = Static<typeof DrainReply>;
export const NodesListRequest = Type.Object({ state: Type.Optional(literals(NodeStates)), backend: Type.Optional(literals(Backends)) }, { $id: 'NodesListRequest' });
export const NodesListReply = Type.Object({ nodes: Type.Array(NodeRecord, { description: 'sorted by node id' }) }, { $id: 'NodesListReply' });
/** `node.<node>.info`: the node's record and what it holds now. */
export const NodeInfoReply = Type.Intersect(
  [
    NodeRecord,
    Type.Object({
      ids: Type.Array(Type.String(), { description: 'the sandboxes live on the node' }),
      snapshots: Type.Object({ count: Type.Integer(), bytes: Type.Number(), budgetBytes: Type.Number() }),
      creates: Type.Object({ running: Type.Integer(), waiting: Type.Integer() }, { description: 'creates being made, and queued behind them' }),
      process: Type.Object({ heapUsedBytes: Type.Number(), rssBytes: Type.Number() }),
      layers: Type.Object({}, { additionalProperties: true, description: "the node's layer cache and the layers it has mounted (mode, store, budget, counters per layer)" }),
      fnPools: Type.Optional(Type.Unknown({ description: "FnCall's pools on this node, per language" })),
      fnImages: Type.Optional(Type.Unknown({ description: "FnCall's images on this node and their states" })),
    }),
  ],
  { $id: 'NodeInfoReply' },
);

/** Every named schema, for the JSON Schema document (`$ref`s resolve among these). */
/** What a sandbox uses now, as far as its backend can tell (the `stats` verb): each field only when known. */
export const SandboxStats = Type.Object(
  {
    cpuSec: Type.Optional(Type.Number({ description: 'CPU time used, seconds' })),
    memoryBytes: Type.Optional(Type.Number()),
    diskBytes: Type.Optional(Type.Number({ description: 'bytes in its writable layer' })),
    pids: Type.Optional(Type.Integer()),
  },
  { $id: 'SandboxStats' },
);
export type SandboxStats = Static<typeof SandboxStats>;

export const NamedSchemas: Record<string, TSchema> = {
  SandboxStats,
  WireError: WireErrorSchema,
  NetworkPolicy,
  DisplaySpec,
  SandboxSpec,
  SandboxInfo,
  ComputerAction,
  ComputerReply,
  Screenshot,
  DisplayViewRequest,
  DisplayViewReply,
  PortsConnectRequest,
  PortEvent,
  PortsSendRequest,
  PortsCloseRequest,
  PortsCloseReply,
  PortsCreditRequest,
  PortsUrlRequest,
  PortsUrlReply,
  CreateRequest,
  CreateReply,
  LifecycleRequest,
  KillRequest,
  Empty,
  ExecRequest,
  ExecResult,
  ExecEvent,
  ExecCancelRequest,
  ExecCancelReply,
  ExecResumeRequest,
  ExecCreditRequest,
  ExecResumeReply,
  ProcessStartRequest,
  ProcessInfo,
  ProcessListReply,
  ProcessGetRequest,
  ProcessWaitRequest,
  ProcessKillRequest,
  ProcessInputRequest,
  ProcessResizeRequest,
  ProcessOutputRequest,
  ProcessOutputCancelRequest,
  ProcessOutputCancelReply,
  ProcessOutputCreditRequest,
  ProcessEvent,
  FilesReadRequest,
  FilesReadReply,
  FilesWriteRequest,
  FilesWriteReply,
  FilesListRequest,
  FilesListReply,
  FileEntry,
  FilesRemoveRequest,
  FilesUploadRequest,
  FilesUploadReply,
  FilesDownloadRequest,
  FilesDownloadReply,
  FilesWatchRequest,
  FileWatchEvent,
  FilesWatchLeaseRequest,
  FilesWatchLeaseReply,
  NetworkSetRequest,
  NetworkSetReply,
  GroupReply,
  NodeGroupRequest,
  SandboxesListRequest,
  SandboxesListReply,
  SandboxesGetRequest,
  PlacePendingRequest,
  PlacePendingReply,
  SnapshotInfo,
  ForkRequest,
  ForkReply,
  SnapshotsListRequest,
  SnapshotsListReply,
  SnapshotsDeleteRequest,
  SnapshotsDeleteReply,
  RolloutRecord,
  RolloutsStartRequest,
  RolloutsAttachRequest,
  RolloutView,
  RolloutsGetRequest,
  RolloutsStepsRequest,
  RolloutsStepsReply,
  RolloutsExportRequest,
  RolloutsExportReply,
  RolloutsDeleteRequest,
  RolloutsDeleteReply,
  FnLimits,
  FnInvokeRequest,
  FnRunResult,
  FnTestResult,
  FnInvokeResult,
  Resources,
  BackendOffer,
  NodeRecord,
  NodesListRequest,
  NodesListReply,
  NodeInfoReply,
  DrainRequest,
  DrainReply,
};

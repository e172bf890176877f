/**
 * The one interface every kind of sandbox implements, and the plugin shape a backend folder
 * exports. The sandbox actor calls a `Backend`; the node opens one per kind it offers through the
 * registry (backends.ts). A new backend is a new folder under runtime/ that exports a
 * `BackendPlugin` and passes test/backend-contract.test.ts; nothing else moves.
 */

import type { Duplex } from 'node:stream';
import type { Logger } from 'pino';
import type { BackendKind, ComputerAction, ExecVerdict, FileChange, FileEntry, NetworkPolicy, Resources, SandboxSpec, SandboxStats } from '../protocol/index.ts';
import type { NodeConfig } from './config.ts';
import type { NodeImages } from './images/node-images.ts';
import type { ImageManifest, LayerRef } from './images/store.ts';

export interface ExecOptions {
  cmd: string[];
  cwd?: string;
  env?: Record<string, string>;
  stdin?: Uint8Array;
  timeoutMs: number;
  maxOutputBytes: number;
  /** Called with each chunk as it arrives (streamed exec). Output is also collected unless `discard`. */
  onOutput?: (stream: 'out' | 'err', chunk: Buffer) => void;
  /** Do not keep output for the result (a stream delivers it already). */
  discard?: boolean;
  signal?: AbortSignal;
  /**
   * A streamed exec's flow control: while \`held()\`, the backend leaves the command's output unread
   * (the command then waits on its pipe) until \`whenOpen\` calls back. Only while the command runs:
   * what it left in its pipes at the exit or a kill is read at once. A backend that cannot hold its
   * output ignores it; its output is then bounded by maxOutputBytes alone.
   */
  flow?: OutputFlow;
}

export interface OutputFlow {
  held(): boolean;
  whenOpen(cb: () => void): void;
}

export interface ExecOutcome {
  exitCode: number;
  signal?: string;
  stdout: Buffer;
  stderr: Buffer;
  durationMs: number;
  truncated: boolean;
  timedOut: boolean;
  /** Its stderr said ENOSPC ("No space left on device"), the one trace a refused fallocate or a full inode table leaves. */
  noSpace?: boolean;
  /** Which limit ended the exec, when the backend can tell (see runtime/container/verdict.ts). */
  verdict?: ExecVerdict;
}

/**
 * The files API of one sandbox, confined to its root. The container backend reaches the root from
 * the host side (files.ts); a VM backend implements it over its guest agent; the simulated one in
 * memory. Errors are ProtocolErrors (NOT_FOUND, FORBIDDEN, DISK_LIMIT, …).
 */
export interface SandboxFiles {
  read(path: string, offset?: number, length?: number): Promise<{ data: Uint8Array; size: number; eof: boolean }>;
  write(path: string, data: Uint8Array, opts?: { offset?: number; mode?: number }): Promise<{ size: number }>;
  list(path: string): Promise<FileEntry[]>;
  remove(path: string, recursive: boolean): Promise<void>;
  /**
   * Unpacks a tar archive into the existing directory `path`, fed chunk by chunk: each `write`
   * resolves once the chunk's entries are written. Backends without it refuse `files.upload`.
   */
  upload?(path: string): Promise<TreeUpload>;
  /** A tar archive of `path` (symlinks as symlinks), pulled piece by piece. Backends without it refuse `files.download`. */
  download?(path: string): AsyncGenerator<Uint8Array, void, undefined>;
  /**
   * Reports changes in the directory `path` (and below it, recursive) until closed; resolves once
   * watching. `onEnd` is called when the watch ends by itself. Backends without it refuse `files.watch`.
   */
  watch?(path: string, recursive: boolean, onChange: (ev: { type: FileChange; path: string; pathBytes?: Uint8Array }) => void, onEnd: (reason: 'removed' | Error) => void): Promise<{ close(): void }>;
}

/** An upload under way (SandboxFiles.upload). */
export interface TreeUpload {
  write(chunk: Uint8Array): Promise<{ entries: number; bytes: number; done: boolean }>;
  /** The last chunk: the archive must be complete. */
  end(chunk?: Uint8Array): Promise<{ entries: number; bytes: number; done: boolean }>;
  /** Stops where it is; what was written stays. */
  close(): Promise<void>;
}

/** What a hibernation gave back to the host. Every field is optional: each backend says what it can. */
export interface HibernateOutcome {
  /** Host memory given back. */
  releasedBytes?: number;
  /** Part of it went to swap (containers without a snapshot). */
  swapped?: boolean;
  /** Bytes of state written to disk to come back from (a VM snapshot). */
  snapshotBytes?: number;
}

/**
 * The abort reason a sandbox's host gives the signal of each exec still running when the sandbox
 * is killed: the exec's verdict is then KILLED; any other abort is the caller's (CANCELLED).
 */
export const EXEC_KILLED = 'killed';

/** A sandbox's counters of its limits biting (the kernel's: pids.events `max`, the memory cgroup's `oom_kill`). */
export interface LimitCounters {
  pidsMax: number;
  oomKills: number;
}

/**
 * The verdict of an exec from its outcome and the sandbox's limit counters before and after it.
 * Precedence when several apply: MEMORY_LIMIT, PIDS_LIMIT, DISK_LIMIT (they say why), then TIMEOUT
 * and OUTPUT_LIMIT (what Paddock did about it).
 */
export function verdictOf(o: Pick<ExecOutcome, 'exitCode' | 'timedOut' | 'truncated' | 'noSpace'>, before: LimitCounters, after: LimitCounters, full: boolean, stopped?: AbortSignal): ExecVerdict {
  // A killed sandbox's exec sees its teardown: the writable layer unmounted under it reads as full,
  // its cgroup as gone. The kill is why it ended.
  if (stopped?.aborted && stopped.reason === EXEC_KILLED) return 'KILLED';
  if (after.oomKills > before.oomKills) return 'MEMORY_LIMIT';
  if (after.pidsMax > before.pidsMax) return 'PIDS_LIMIT';
  // A full layer matters only to a command that failed: a later `ls` on a full disk is OK. A
  // fallocate past the layer's size is refused without filling it: only its ENOSPC tells.
  if ((full || o.noSpace) && o.exitCode !== 0) return 'DISK_LIMIT';
  if (o.timedOut) return 'TIMEOUT';
  if (o.truncated) return 'OUTPUT_LIMIT';
  if (stopped?.aborted) return stopped.reason === EXEC_KILLED ? 'KILLED' : 'CANCELLED';
  return 'OK';
}

export interface Backend {
  readonly kind: BackendKind;
  /**
   * All-or-nothing: on failure, whatever was set up is undone before the promise rejects. The
   * backend resolves the spec's images itself (the plugin's `checkSpec` has seen them exist).
   */
  create(id: string, spec: SandboxSpec): Promise<void>;
  exec(id: string, opts: ExecOptions): Promise<ExecOutcome>;
  /** The files API, confined to the sandbox's root. */
  files(id: string): SandboxFiles;
  /** Freezes every process of the sandbox (state and memory kept). */
  pause(id: string): Promise<void>;
  resume(id: string): Promise<void>;
  /** Frozen and its memory given back to the node. On failure it leaves the sandbox running, as it found it. */
  hibernate(id: string): Promise<HibernateOutcome>;
  restore(id: string): Promise<void>;
  /** Changes the sandbox's egress policy while it runs (backends without networking omit it: capability `network`). */
  setNetwork?(id: string, policy: NetworkPolicy): Promise<void>;
  /** What the sandbox uses now (capability `stats`). */
  stats?(id: string): Promise<SandboxStats>;
  /** Removes everything the sandbox had: processes, mounts, cgroups, state. Idempotent. */
  destroy(id: string): Promise<void>;
  /**
   * Finds and removes the leftovers of a previous run of this node (after a crash); their ids.
   * A backend that can (capability Adopting) keeps the sandboxes it can take up instead.
   */
  recover(): Promise<string[]>;
  /** Unmounts shared layers and the like; sandboxes must be destroyed first. */
  close(): Promise<void>;
}

/**
 * Capability: start new sandboxes from a running one's state (microVM templates). Snapshots are
 * files on the node's disk: they outlive the sandbox they were taken of and the node's process.
 */
export interface Snapshotting {
  /**
   * Saves the sandbox's whole state under `name` (default: one the backend picks), with `meta`
   * kept beside it; the sandbox runs on. On failure nothing of the snapshot is left. `local`: it
   * will only be started on this node (a fork's), so the backend may keep only what differs from
   * what this node already holds (a VM's template); it cannot then be exported.
   */
  snapshot(id: string, opts?: { name?: string; meta?: Record<string, unknown>; local?: boolean }): Promise<{ snapshot: string; bytes: number }>;
  /** A new sandbox `newId` with the state of `snapshot`; `spec` must ask for the machine it was taken of (INVALID_SPEC). */
  restoreFrom(snapshot: string, newId: string, spec: SandboxSpec): Promise<void>;
  /** A new sandbox `newId` that starts as a copy of the running `id`. */
  fork(id: string, newId: string, spec: SandboxSpec): Promise<void>;
}

/** What snapshots need of the image store: a container's files as a layer, a VM's state as a blob. */
export interface SnapshotImages {
  /** Uploads a finished blob file; its reference. */
  pushLayer(file: string): Promise<LayerRef>;
  get(name: string): Promise<ImageManifest | null>;
  put(m: ImageManifest): Promise<ImageManifest>;
  remove(name: string): Promise<void>;
}

/** Where a VM snapshot's state is in the image store, and the machine it loads into. */
export interface StoredState {
  digest: string;
  size: number;
  machine: string;
}

/** Snapshots that move between nodes through the image store (beside SnapshotStore). */
export interface MovableSnapshots {
  /** Copies snapshot `name`'s state into the image store, kept there until the snapshot is deleted. */
  exportSnapshot(name: string): Promise<StoredState>;
  /** Fetches another node's snapshot into this node's disk under `name` (removed with deleteSnapshot). */
  importSnapshot(name: string, state: StoredState): Promise<void>;
}

export function movesSnapshots(b: Backend): b is Backend & Snapshotting & SnapshotStore & MovableSnapshots {
  return typeof (b as Partial<MovableSnapshots>).exportSnapshot === 'function' && typeof (b as Partial<MovableSnapshots>).importSnapshot === 'function';
}

/** Snapshots kept as files on the node's disk (beside Snapshotting): listed after a restart, removed by name. */
export interface SnapshotStore {
  /** The snapshots on this node's disk, each with the meta it was saved with. */
  listSnapshots(): Promise<Array<{ snapshot: string; bytes: number; meta?: Record<string, unknown> }>>;
  /** Removes a snapshot's files; nothing to do for one that is not there. */
  deleteSnapshot(name: string): Promise<void>;
}

/** Capability: a screen and input devices (full VMs for computer use). */
export interface Display {
  /** The screen as the VMM shows it, as a PNG. */
  screenshot(id: string): Promise<{ png: Uint8Array; width: number; height: number }>;
  /** One computer-use action through the VMM's input devices (checked whole before anything is sent); where the pointer is afterwards. */
  act(id: string, action: ComputerAction): Promise<{ cursor: { x: number; y: number } }>;
  /** A URL a person opens to watch the screen live; `control` lets them type and click too. */
  view(id: string, control: boolean): Promise<{ url: string; control: boolean }>;
}

/**
 * Capability: connections to TCP ports inside the sandbox, made from the node's side (the sandbox
 * needs no network for them): a dev server, a test service the agent started.
 */
export interface PortForwarding {
  /**
   * A byte stream to `port` on the sandbox's loopback. NOT_FOUND when nothing listens there;
   * destroying the stream closes the connection.
   */
  connectPort(id: string, port: number): Promise<Duplex>;
}

export function canForwardPorts(b: Backend): b is Backend & PortForwarding {
  return typeof (b as Partial<PortForwarding>).connectPort === 'function';
}

/** A background process to start (capability `processes`). */
export interface ProcessOptions {
  /** Empty with `pty`: the image's shell. */
  cmd: string[];
  cwd?: string;
  env?: Record<string, string>;
  /** Kill it (timedOut) after this long; absent: never (the sandbox's ttl bounds it). */
  timeoutMs?: number;
  /** Cap on stdout and on stderr, each, over its life (truncated); absent: none. */
  maxOutputBytes?: number;
  /** Run it on a pseudo-terminal of this size: stdout carries the terminal, stderr stays empty. */
  pty?: { cols: number; rows: number };
  /** Each chunk of output as it comes. */
  onOutput: (stream: 'out' | 'err', chunk: Buffer) => void;
  /** Holding readers' flow (ExecOptions.flow): while held, the output is left unread and the process waits on its pipe. */
  flow?: OutputFlow;
  /** Aborting kills its whole tree (reason EXEC_KILLED: verdict KILLED). */
  signal?: AbortSignal;
}

/** A process a backend started: its stdin stays open for `write` until `closeStdin`. */
export interface RunningProcess {
  /** What runs (a terminal's default shell filled in). */
  readonly cmd: string[];
  /** Its pid inside the sandbox, when the backend can tell. */
  readonly pid?: number;
  /** Bytes for its stdin (a terminal: typed input). Rejects BUSY when it does not read and too much is waiting. */
  write(data: Uint8Array): Promise<void>;
  closeStdin(): void;
  /** A terminal's new size (its foreground process gets SIGWINCH). */
  resize(cols: number, rows: number): void;
  /** Sends `signal` (a name such as SIGTERM) to it; SIGKILL ends its whole tree. */
  kill(signal: string): Promise<void>;
  /** Its end, in exec's terms. */
  readonly done: Promise<ExecOutcome>;
}

/**
 * Capability: background processes with a stdin that stays open, and terminals. The node keeps
 * their output and their table (actors/processes.ts); the backend only starts, feeds and signals.
 */
export interface Processes {
  startProcess(id: string, opts: ProcessOptions): Promise<RunningProcess>;
}

export function hasProcesses(b: Backend): b is Backend & Processes {
  return typeof (b as Partial<Processes>).startProcess === 'function';
}

export function canSnapshot(b: Backend): b is Backend & Snapshotting {
  return typeof (b as Partial<Snapshotting>).fork === 'function' && typeof (b as Partial<Snapshotting>).snapshot === 'function';
}

export function keepsSnapshots(b: Backend): b is Backend & Snapshotting & SnapshotStore {
  return canSnapshot(b) && typeof (b as Partial<SnapshotStore>).listSnapshots === 'function' && typeof (b as Partial<SnapshotStore>).deleteSnapshot === 'function';
}

/**
 * Capability: sandboxes that outlive the node's process (a VM's state is a file, its VMM a process
 * of its own; a container's processes run on without the node). `recover` keeps what it can of a
 * previous run instead of removing it; `kept` says which, with the spec each was made with and
 * how it was kept, and the node takes them up under their ids.
 */
export interface Adopting {
  kept(): KeptSandbox[];
}

export interface KeptSandbox {
  id: string;
  spec: SandboxSpec;
  /** `running`, or `frozen` (its processes stopped, resumed by `resume`); absent: hibernated, woken by `restore`. */
  state?: 'running' | 'frozen';
}

export function canAdopt(b: Backend): b is Backend & Adopting {
  return typeof (b as Partial<Adopting>).kept === 'function';
}

export function hasDisplay(b: Backend): b is Backend & Display {
  return typeof (b as Partial<Display>).screenshot === 'function';
}

/** What a backend's `open` gets from the node. */
export interface BackendContext {
  cfg: NodeConfig;
  images: NodeImages;
  log: Logger;
  env: NodeJS.ProcessEnv;
}

/** What a backend folder exports for the registry. */
export interface BackendPlugin {
  readonly kind: BackendKind;
  /** What this backend may hand out on this host (overcommit included): its admission pool. */
  capacity(cfg: NodeConfig, env: NodeJS.ProcessEnv, log?: Logger): Resources;
  /** Checks of its own beyond the protocol's (an image it can run, fields it cannot honour); throws INVALID_SPEC. */
  checkSpec(spec: SandboxSpec, ctx: BackendContext): Promise<void>;
  open(ctx: BackendContext): Promise<Backend>;
}

/**
 * The one interface every kind of sandbox implements. The sandbox actor calls it; the node picks
 * the implementation by `spec.backend`. A new backend is a new folder under runtime/ implementing
 * this, nothing else moves.
 */
import type { BackendKind, ExecVerdict, NetworkPolicy, SandboxSpec } from '../protocol/index.ts';
import type { RootFiles } from './files.ts';
import type { ImageManifest } from './images/store.ts';

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
 * The abort reason a sandbox's host gives the signal of each exec still running when the sandbox
 * is killed: the exec's verdict is then KILLED; any other abort is the caller's (CANCELLED).
 */
export const EXEC_KILLED = 'killed';

export interface Backend {
  readonly kind: BackendKind;
  /** All-or-nothing: on failure, whatever was set up is undone before the promise rejects. */
  create(id: string, spec: SandboxSpec, image: ImageManifest): Promise<void>;
  exec(id: string, opts: ExecOptions): Promise<ExecOutcome>;
  /** The files API, confined to the sandbox's root. */
  files(id: string): RootFiles;
  /** Freezes every process of the sandbox (state and memory kept). */
  pause(id: string): Promise<void>;
  resume(id: string): Promise<void>;
  /**
   * Freezes the sandbox and gives its memory back to the node (page cache; anonymous memory where
   * the node has swap). On failure it leaves the sandbox running, as it found it.
   */
  hibernate(id: string): Promise<{ bytes: number; swapped: boolean }>;
  restore(id: string): Promise<void>;
  /** Changes the sandbox's egress policy while it runs (backends without networking omit it). */
  setNetwork?(id: string, policy: NetworkPolicy): Promise<void>;
  /** Removes everything the sandbox had: processes, mounts, cgroups, state. Idempotent. */
  destroy(id: string): Promise<void>;
  /** Finds and removes the leftovers of a previous run of this node (after a crash). */
  recover(): Promise<string[]>;
  /** Unmounts shared layers and the like; sandboxes must be destroyed first. */
  close(): Promise<void>;
}

/**
 * Every numeric bound of the protocol, in one place: the schema (protocol/schema.ts) takes its
 * minimums, maximums and defaults from here, and so do the servers that enforce sizes before
 * decoding and the SDK that splits large transfers.
 */
export const Limits = {
  cpu: { min: 0.01, max: 64, default: 1 },
  memoryMiB: { min: 16, max: 256 * 1024, default: 256 },
  pidsLimit: { min: 8, max: 65536, default: 1024 },
  diskMiB: { min: 16, max: 256 * 1024, default: 512 },
  ttlSec: { min: 1, max: 7 * 24 * 3600, default: 3600 },
  idleTimeoutSec: { min: 1, max: 7 * 24 * 3600, default: 0 },
  network: { allowMax: 256, domainsMax: 256, portsMax: 64, domainMax: 253 },
  labels: { max: 64, keyMax: 63, valueMax: 256 },
  env: { max: 512, bytesMax: 128 * 1024 },
  exec: {
    argsMax: 65536,
    argBytesMax: 1024 * 1024,
    timeoutMs: { min: 1, max: 24 * 3600 * 1000, default: 60_000 },
    maxOutputBytes: { min: 0, max: 64 * 1024 * 1024, default: 1024 * 1024 },
    stdinMax: 4 * 1024 * 1024,
  },
  /**
   * Background processes and terminals of one sandbox: how many may run at once, the output each
   * keeps per stream for late readers, how many that have exited stay listed, what one input
   * message may carry, and a terminal's size.
   */
  processes: {
    liveMax: 64,
    exitedKept: 64,
    bufferBytes: { min: 4096, max: 16 * 1024 * 1024, default: 1024 * 1024 },
    inputMax: 1024 * 1024,
    readersMax: 16,
    /**
     * A holding reader (`window`) that credits nothing for this long while it holds the process
     * is let go (CANCELLED) and the process goes on: a reader that went away cannot stop it for good.
     */
    stallMs: { min: 1000, max: 3_600_000, default: 60_000 },
    /** A holding reader's window: at most half the process's buffer (checked by the node), so what it has not credited is still held. */
    window: { min: 64 * 1024, max: 8 * 1024 * 1024 },
    cols: { min: 1, max: 1000, default: 80 },
    rows: { min: 1, max: 1000, default: 24 },
  },
  /** watchLeaseMs: a watch not renewed for this long ends (the SDK renews every third of it). */
  files: { pathMax: 4096, chunkMax: 4 * 1024 * 1024, watchLeaseMs: 15_000 },
  /** Full VMs: screen sizes, how much one `type` may carry, how long `wait`/`hold_key` may last, actions queued per sandbox. */
  display: { widthMin: 320, widthMax: 3840, heightMin: 200, heightMax: 2160, width: 1024, height: 768, typeMax: 4096, keysMax: 16, scrollMax: 100, durationMaxSec: 30, queueMax: 64 },
  /** Largest request accepted before decoding: a sandbox verb (a 4 MiB file chunk or stdin + room). */
  requestBytesMax: 6 * 1024 * 1024,
  /** Largest create request (a spec is small; env and labels bound it). */
  createBytesMax: 512 * 1024,
  /** Copies one fork makes at most (they start on the parent's node, from one snapshot). */
  fork: { max: 64 },
  /** A node's disk for snapshots of VM sandboxes, unless PADDOCK_SNAPSHOT_BUDGET_MIB says otherwise. */
  snapshotBudgetMiB: { default: 8192 },
  /** Directory listings: sandboxes per page (a page also stays under the reply size the server can send). */
  list: { max: 5000, default: 1000 },
  rollout: {
    /** How long a rollout's log is kept after its last record, unless the rollout says otherwise. */
    retentionSec: { default: 7 * 24 * 3600 },
  },
  /** FnCall invocations (the whole request also stays under requestBytesMax). */
  fn: {
    timeMs: { min: 1, max: 60_000, default: 2000 },
    wallMs: { min: 1, max: 600_000 },
    memoryMiB: { min: 16, max: 8192, default: 256 },
    outputBytes: { min: 0, max: 4 * 1024 * 1024, default: 1024 * 1024 },
    tests: 512,
    files: 256,
    pathMax: 255,
    args: 256,
    /** Each test's stdout and stderr in the reply are cut to this (the judge saw all of it). */
    testPreviewBytes: 4096,
  },
} as const;

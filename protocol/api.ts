/**
 * Every operation on the wire, described from the schema: its subject, request and reply
 * messages, the errors it gives, its limits, the client timeout to use and whether to retry.
 * From here come the JSON Schema document (protocol/schema.json: `npm run gen:protocol`) and the
 * README's protocol table; test/protocol-schema.test.ts fails when either is out of date.
 */
import type { TSchema } from '@sinclair/typebox';
import { type ErrorCode, ErrorCodes } from './errors.ts';
import { Limits } from './limits.ts';
import { NamedSchemas } from './schema.ts';

const MiB = 1024 * 1024;
const mib = (n: number) => `${n / MiB} MiB`;

export interface Operation {
  /** `<id>`, `<node>`, `<group>`, `<verb>` stand for subject tokens. */
  subject: string;
  /** A request-reply call, or a stream to the caller's inbox (exec with `stream: true`). */
  kind: 'request' | 'stream';
  /** Names in NamedSchemas. */
  request: string;
  reply: string;
  /** What the reply is, in words, when its schema alone does not say. */
  replyNote?: string;
  errors: ErrorCode[];
  limits: string;
  /** What a client should wait for the reply. */
  timeout: string;
  retry: string;
  /** Queue group: any one replica answers. */
  queue?: string;
}

const sbErrors: ErrorCode[] = ['INVALID_REQUEST', 'NOT_FOUND', 'INVALID_STATE', 'UNKNOWN_VERB'];
const REQ = `request ≤ ${mib(Limits.requestBytesMax)}`;

export const Operations: Operation[] = [
  {
    subject: 'pdk.v1.place.create',
    kind: 'request',
    request: 'CreateRequest',
    reply: 'CreateReply',
    errors: ['INVALID_REQUEST', 'INVALID_SPEC', 'NOT_FOUND', 'PAYLOAD_TOO_LARGE', 'NO_CAPACITY', 'TIMEOUT', 'BACKEND_FAILED'],
    limits: `request ≤ ${Limits.createBytesMax / 1024} KiB; with \`spec.fromSnapshot\`: a VM's on the snapshot's node, a container's on any node that reads its image store (NOT_FOUND for an unknown snapshot)`,
    timeout: "the request's `timeoutMs` (the SDK sends its call's, 60 s by default); without one placement waits 120 s for the node",
    retry: 'NO_CAPACITY, TIMEOUT, BACKEND_FAILED: back off and retry with the same `id`',
    queue: 'pdk-placement',
  },
  {
    subject: 'pdk.v1.place.pending',
    kind: 'request',
    request: 'PlacePendingRequest',
    reply: 'PlacePendingReply',
    replyNote: 'from each replica that holds one of the ids; the others stay silent. The SDK sends one every 2 s for its creates in flight longer than that, and fails a create no replica has held for 10 s (its replica died with it) with UNAVAILABLE, `detail.reason` `placement_lost`',
    errors: ['INVALID_REQUEST'],
    limits: 'at most 1,000 ids',
    timeout: 'collect answers for ~1 s',
    retry: 'safe to retry',
  },
  {
    subject: 'pdk.v1.sandboxes.list',
    kind: 'request',
    request: 'SandboxesListRequest',
    reply: 'SandboxesListReply',
    replyNote: 'a page; pass `next` as `cursor` until it is absent',
    errors: ['INVALID_REQUEST', 'UNAVAILABLE'],
    limits: `${Limits.list.default} per page by default (≤ ${Limits.list.max}), and at most one NATS message`,
    timeout: '10 s per page',
    retry: 'safe to retry',
    queue: 'pdk-placement',
  },
  {
    subject: 'pdk.v1.sandboxes.get',
    kind: 'request',
    request: 'SandboxesGetRequest',
    reply: 'SandboxInfo',
    replyNote: 'the live record, or the directory’s for an ended sandbox',
    errors: ['INVALID_REQUEST', 'NOT_FOUND', 'UNAVAILABLE'],
    limits: '',
    timeout: '10 s',
    retry: 'safe to retry',
    queue: 'pdk-placement',
  },
  {
    subject: 'pdk.v1.sb.<id>.info',
    kind: 'request',
    request: 'Empty',
    reply: 'SandboxInfo',
    errors: ['NOT_FOUND'],
    limits: '',
    timeout: '10 s',
    retry: 'safe to retry',
  },
  {
    subject: 'pdk.v1.sb.<id>.exec',
    kind: 'request',
    request: 'ExecRequest',
    reply: 'ExecResult',
    errors: [...sbErrors, 'PAYLOAD_TOO_LARGE', 'REPLAY_MISMATCH', 'STEP_CONFLICT', 'STEP_OUT_OF_ORDER', 'UNKNOWN_OUTCOME', 'BACKEND_FAILED'],
    limits: `${REQ}; stdin ≤ ${mib(Limits.exec.stdinMax)}; 2 × maxOutputBytes + 64 KiB must fit the server's max_payload (else stream)`,
    timeout: 'timeoutMs + 10 s',
    retry: 'not idempotent: retry only as a rollout step (rolloutId + step), which replays; STEP_CONFLICT: wait and ask again',
  },
  {
    subject: 'pdk.v1.sb.<id>.exec (stream: true)',
    kind: 'stream',
    request: 'ExecRequest',
    reply: 'ExecEvent',
    replyNote: 'to the reply inbox: `{t:"out"|"err", d, s}` chunks (the output the node read in one turn of its loop, up to 256 KiB), then one `{t:"exit", …, s}`; a failure is `{t:"error"}` or a `{ok:false}` reply; `s` numbers the events from 0, a missing one is asked for again with exec.resume; with `window` (containers), the node sends at most that many output bytes past the last `exec.credit {execId, received}` (published, no reply; the offset of an exec.resume counts as one) and leaves the command’s output unread until the next: the SDK asks for 8 MiB',
    errors: [...sbErrors, 'PAYLOAD_TOO_LARGE', 'BACKEND_FAILED'],
    limits: `${REQ}; each chunk ≤ one NATS message; with rolloutId + step it is recorded whole at its end (2 × maxOutputBytes + 64 KiB must fit max_payload) and a replay streams the recorded output, its exit marked replayed`,
    timeout: 'timeoutMs + 10 s of silence',
    retry: 'not idempotent; leaving early: send exec.cancel with the execId',
  },
  {
    subject: 'pdk.v1.sb.<id>.exec.cancel',
    kind: 'request',
    request: 'ExecCancelRequest',
    reply: 'ExecCancelReply',
    errors: ['INVALID_REQUEST', 'NOT_FOUND'],
    limits: '',
    timeout: '10 s',
    retry: 'safe to retry',
  },
  {
    subject: 'pdk.v1.sb.<id>.exec.resume',
    kind: 'request',
    request: 'ExecResumeRequest',
    reply: 'ExecResumeReply',
    replyNote: 'the events from `from` on are sent again to the stream’s inbox (the node keeps the last 512 KiB of each stream, and a stream’s end for 30 s); older ones come back as one `{t:"gap", s, n, bytes}`',
    errors: ['INVALID_REQUEST', 'NOT_FOUND'],
    limits: '',
    timeout: '10 s',
    retry: 'safe to retry',
  },
  {
    subject: 'pdk.v1.sb.<id>.files.read',
    kind: 'request',
    request: 'FilesReadRequest',
    reply: 'FilesReadReply',
    replyNote: `at most ${mib(Limits.files.chunkMax)} of data per call: read on from offset + data.length until eof`,
    errors: [...sbErrors, 'FORBIDDEN'],
    limits: `length ≤ ${mib(Limits.files.chunkMax)} per call`,
    timeout: '60 s',
    retry: 'safe to retry',
  },
  {
    subject: 'pdk.v1.sb.<id>.files.write',
    kind: 'request',
    request: 'FilesWriteRequest',
    reply: 'FilesWriteReply',
    errors: [...sbErrors, 'FORBIDDEN', 'DISK_LIMIT', 'PAYLOAD_TOO_LARGE', 'REPLAY_MISMATCH', 'STEP_CONFLICT'],
    limits: `data ≤ ${mib(Limits.files.chunkMax)} per call: larger files in parts with offset`,
    timeout: '60 s',
    retry: 'idempotent with an offset; a whole-file write replaces again',
  },
  {
    subject: 'pdk.v1.sb.<id>.files.list',
    kind: 'request',
    request: 'FilesListRequest',
    reply: 'FilesListReply',
    errors: [...sbErrors, 'FORBIDDEN'],
    limits: '',
    timeout: '60 s',
    retry: 'safe to retry',
  },
  {
    subject: 'pdk.v1.sb.<id>.files.remove',
    kind: 'request',
    request: 'FilesRemoveRequest',
    reply: 'Empty',
    errors: [...sbErrors, 'FORBIDDEN'],
    limits: '',
    timeout: '60 s',
    retry: 'repeatable, but a second try says NOT_FOUND: the SDK does not send it again after a dropped connection',
  },
  {
    subject: 'pdk.v1.sb.<id>.files.upload',
    kind: 'request',
    request: 'FilesUploadRequest',
    reply: 'FilesUploadReply',
    replyNote: 'each chunk is answered once its entries are written; send the next only then. Entries are written as they come: on an error, those before the failing one stay (detail.entries counts them), and the upload is over',
    errors: [...sbErrors, 'FORBIDDEN', 'DISK_LIMIT', 'PAYLOAD_TOO_LARGE', 'BUSY'],
    limits: `data ≤ ${mib(Limits.files.chunkMax)} per chunk; path must be an existing directory; regular files, directories and symlinks only (hardlinks, devices, FIFOs: FORBIDDEN); no \`..\`; 30 s between chunks at most`,
    timeout: '60 s per chunk',
    retry: 'a chunk sent again with the same seq is answered again, not written twice',
  },
  {
    subject: 'pdk.v1.sb.<id>.files.download',
    kind: 'request',
    request: 'FilesDownloadRequest',
    reply: 'FilesDownloadReply',
    replyNote: `a tar archive of the path, pulled chunk by chunk (≤ ${mib(Limits.files.chunkMax)} each) until eof; symlinks are not followed, other filesystems (/proc, /dev, /sys) and special files are left out`,
    errors: [...sbErrors, 'FORBIDDEN', 'BUSY'],
    limits: '30 s between pulls at most',
    timeout: '60 s per chunk',
    retry: 'asking for the same seq again gets the same bytes',
  },
  {
    subject: 'pdk.v1.sb.<id>.files.watch',
    kind: 'stream',
    request: 'FilesWatchRequest',
    reply: 'FileWatchEvent',
    replyNote: 'events to the reply inbox: `ready`, then `change`s, then `end` or `error`; renew the lease (files.watch.renew) every few seconds or the watch ends',
    errors: [...sbErrors, 'FORBIDDEN', 'BUSY'],
    limits: 'directories watched per sandbox and per node are bounded (BUSY past them)',
    timeout: 'lease of 15 s',
    retry: 'not idempotent: a watchId in use is refused',
  },
  {
    subject: 'pdk.v1.sb.<id>.files.watch.renew | files.watch.cancel',
    kind: 'request',
    request: 'FilesWatchLeaseRequest',
    reply: 'FilesWatchLeaseReply',
    errors: ['INVALID_REQUEST'],
    limits: '',
    timeout: '10 s',
    retry: 'safe to retry',
  },
  {
    subject: 'pdk.v1.sb.<id>.pause | hibernate',
    kind: 'request',
    request: 'LifecycleRequest',
    reply: 'SandboxInfo',
    errors: [...sbErrors, 'BACKEND_FAILED'],
    limits: '',
    timeout: '60 s',
    retry: 'INVALID_STATE when already there; BACKEND_FAILED: retry',
  },
  {
    subject: 'pdk.v1.sb.<id>.resume | restore',
    kind: 'request',
    request: 'Empty',
    reply: 'SandboxInfo',
    errors: [...sbErrors, 'BACKEND_FAILED'],
    limits: '',
    timeout: '60 s',
    retry: 'INVALID_STATE when already running; BACKEND_FAILED: retry',
  },
  {
    subject: 'pdk.v1.sb.<id>.stats',
    kind: 'request',
    request: 'Empty',
    reply: 'SandboxStats',
    replyNote: 'what its backend can tell; fields it cannot are absent',
    errors: sbErrors,
    limits: '',
    timeout: '10 s',
    retry: 'safe to retry',
  },
  {
    subject: 'pdk.v1.sb.<id>.display.screenshot',
    kind: 'request',
    request: 'Empty',
    reply: 'Screenshot',
    replyNote: "the screen as the VMM shows it (QMP screendump), whatever the guest's processes do",
    errors: [...sbErrors, 'BUSY', 'BACKEND_FAILED'],
    limits: 'backends with a display (fullvm)',
    timeout: '15 s',
    retry: 'safe to retry',
  },
  {
    subject: 'pdk.v1.sb.<id>.display.view',
    kind: 'request',
    request: 'DisplayViewRequest',
    reply: 'DisplayViewReply',
    replyNote: "a URL of a page on the node's loopback: the screen live over VNC (noVNC), view only unless `control`",
    errors: [...sbErrors],
    limits: 'backends with a display (fullvm); the URL ends with the sandbox',
    timeout: '10 s',
    retry: 'safe to retry (each call makes a URL of its own)',
  },
  {
    subject: 'pdk.v1.sb.<id>.display.action',
    kind: 'request',
    request: 'ComputerAction',
    reply: 'ComputerReply',
    replyNote: 'the pointer after the action, and a screenshot when asked (always for `screenshot`)',
    errors: [...sbErrors, 'BUSY', 'PAYLOAD_TOO_LARGE', 'BACKEND_FAILED'],
    limits: `one action at a time per sandbox, ≤ ${Limits.display.queueMax} queued (then BUSY); type ≤ ${Limits.display.typeMax} characters; wait, hold_key ≤ ${Limits.display.durationMaxSec} s`,
    timeout: `${Limits.display.durationMaxSec + 30} s`,
    retry: 'not safe: input sent twice is typed twice; on a lost reply take a screenshot and decide',
  },
  {
    subject: 'pdk.v1.sb.<id>.snapshot',
    kind: 'request',
    request: 'Empty',
    reply: 'SnapshotInfo',
    replyNote: "a VM's whole state saved on its node (it runs on after a pause of about the time to write its memory); a container's files as a layer in the image store (frozen for the copy of its writable layer); `spec.fromSnapshot` starts new sandboxes from it",
    errors: [...sbErrors, 'NO_CAPACITY', 'BACKEND_FAILED'],
    limits: "microvm, fullvm, container; within the node's snapshot disk budget (PADDOCK_SNAPSHOT_BUDGET_MIB: else NO_CAPACITY, `detail.reason` `snapshot_budget`)",
    timeout: '60 s',
    retry: 'each call makes a snapshot: after a lost reply, list them (`from`) and delete the extra',
  },
  {
    subject: 'pdk.v1.sb.<id>.fork',
    kind: 'request',
    request: 'ForkRequest',
    reply: 'ForkReply',
    replyNote: "`count` new sandboxes on the parent's node, each a copy of it as it was (a VM: files, processes, memory; a container: files), through the node's admission; labels, group and ttlSec the parent's unless given",
    errors: [...sbErrors, 'NO_CAPACITY', 'BACKEND_FAILED'],
    limits: `count ≤ ${Limits.fork.max}; all or nothing: when the node cannot admit them all, those made are killed and NO_CAPACITY says why`,
    timeout: '60 s + 5 s per copy',
    retry: 'each call makes new sandboxes: after a lost reply, list them (group, labels) before asking again',
  },
  {
    subject: 'pdk.v1.sb.<id>.ports.connect',
    kind: 'stream',
    request: 'PortsConnectRequest',
    reply: 'PortEvent',
    replyNote: "to the reply inbox: `{t:'open', connId}`, then `{t:'d', d}` with the bytes the server sends, then `{t:'end'}` (or `{t:'error'}`); a refusal is a `{ok:false}` reply (NOT_FOUND: nothing listens). The sandbox needs no network: the node connects inside its namespace",
    errors: [...sbErrors, 'NO_CAPACITY', 'BACKEND_FAILED'],
    limits: "containers; 64 open connections per sandbox (NO_CAPACITY); closed after 10 min without traffic and when the sandbox ends; with `window`, the node sends at most that many bytes past the caller's last `ports.credit {connId, received}` (published, no reply) and stops reading the server until the next: the SDK asks for 1 MiB and credits as its reader takes the bytes",
    timeout: '10 s for `open`',
    retry: 'each call opens a connection: after a lost `open`, nothing holds it and it closes when idle',
  },
  {
    subject: 'pdk.v1.sb.<id>.ports.send',
    kind: 'request',
    request: 'PortsSendRequest',
    reply: 'Empty',
    replyNote: 'answered once the bytes are written to the connection (wait for it before the next chunk: that is the flow control); `end: true` half-closes it',
    errors: [...sbErrors, 'BACKEND_FAILED'],
    limits: `d ≤ ${Limits.files.chunkMax / 1024 / 1024} MiB per call`,
    timeout: '30 s',
    retry: 'not safe: bytes sent twice arrive twice',
  },
  {
    subject: 'pdk.v1.sb.<id>.ports.close',
    kind: 'request',
    request: 'PortsCloseRequest',
    reply: 'PortsCloseReply',
    errors: ['INVALID_REQUEST', 'NOT_FOUND'],
    limits: '',
    timeout: '10 s',
    retry: 'safe to retry',
  },
  {
    subject: 'pdk.v1.sb.<id>.ports.url',
    kind: 'request',
    request: 'PortsUrlRequest',
    reply: 'PortsUrlReply',
    replyNote: "a TCP listener on the node's loopback for this port, one per port and sandbox, closed when the sandbox ends: every connection to it is one to the port inside (HTTP or anything else)",
    errors: [...sbErrors, 'BACKEND_FAILED'],
    limits: 'containers; on the node host only (through the gateway: /v1/sandboxes/{id}/ports/{port}/…)',
    timeout: '10 s',
    retry: 'safe to retry: the same port gives the same URL',
  },
  {
    subject: 'pdk.v1.sb.<id>.process.start',
    kind: 'request',
    request: 'ProcessStartRequest',
    reply: 'ProcessInfo',
    replyNote: 'starts a background process (or, with `pty`, a terminal) and answers at once; it runs until it exits, is killed, or its sandbox ends',
    errors: [...sbErrors, 'PIDS_LIMIT', 'BACKEND_FAILED'],
    limits: `${Limits.processes.liveMax} running per sandbox (PIDS_LIMIT past it); output kept per stream: bufferBytes (default ${mib(Limits.processes.bufferBytes.default)}); container backend only`,
    timeout: '30 s',
    retry: 'not idempotent: after a lost reply, process.list (tag) before starting again',
  },
  {
    subject: 'pdk.v1.sb.<id>.process.<verb>',
    kind: 'request',
    request: 'ProcessGetRequest',
    reply: 'ProcessInfo',
    replyNote: '`process.get` and `process.wait` (answers at the exit, or after waitMs with `state: running`) take `{id}`; `process.kill` `{id, signal}`; `process.list` `{}` → ProcessListReply; `process.input` `{id, data, eof}` and `process.resize` `{id, cols, rows}` → `{}`',
    errors: [...sbErrors],
    limits: `input ≤ ${mib(Limits.processes.inputMax)} a message; ${Limits.processes.exitedKept} exited processes stay listed`,
    timeout: '30 s (process.wait: waitMs + 10 s)',
    retry: 'get, list, wait, resize: safe to repeat (the client does after a reconnect); kill: SIGKILL is, another signal is sent again; input: not idempotent',
  },
  {
    subject: 'pdk.v1.sb.<id>.process.output',
    kind: 'stream',
    request: 'ProcessOutputRequest',
    reply: 'ProcessEvent',
    replyNote: 'to the reply inbox: `{t:"out"|"err", d, o}` chunks from the offsets asked for (`o`: the offset of the chunk in its stream), `{t:"gap", stream, o, bytes}` for bytes dropped before this reader got them, then `{t:"exit", …}` or, with follow: false, `{t:"end", out, err}`; with `window` (a holding reader, containers), the node sends at most that many bytes past the last `process.output.credit {id, readerId, out, err}` (published, no reply: the offsets it has) and leaves the process’s output unread until the next; one that credits nothing for `stallMs` is let go with CANCELLED',
    errors: [...sbErrors],
    limits: `${Limits.processes.readersMax} following readers per process (the oldest is ended with an error past it)`,
    timeout: 'until exit; leave early with process.output.cancel',
    retry: 'a new read from the offsets received is safe (the SDK does after a reconnect or a lost message)',
  },
  {
    subject: 'pdk.v1.sb.<id>.kill',
    kind: 'request',
    request: 'KillRequest',
    reply: 'SandboxInfo',
    errors: ['NOT_FOUND'],
    limits: '',
    timeout: '60 s',
    retry: 'safe to retry: no responders afterwards means it is gone',
  },
  {
    subject: 'pdk.v1.sb.<id>.network.set',
    kind: 'request',
    request: 'NetworkSetRequest',
    reply: 'NetworkSetReply',
    errors: [...sbErrors],
    limits: `≤ ${Limits.network.allowMax} allow, ${Limits.network.domainsMax} domains, ${Limits.network.portsMax} ports`,
    timeout: '10 s',
    retry: 'safe to retry',
  },
  {
    subject: 'pdk.v1.snapshots.list',
    kind: 'request',
    request: 'SnapshotsListRequest',
    reply: 'SnapshotsListReply',
    replyNote: 'from the `pdk_snapshots` bucket',
    errors: ['INVALID_REQUEST', 'UNAVAILABLE'],
    limits: '',
    timeout: '10 s',
    retry: 'safe to retry',
    queue: 'pdk-placement',
  },
  {
    subject: 'pdk.v1.snapshots.delete',
    kind: 'request',
    request: 'SnapshotsDeleteRequest',
    reply: 'SnapshotsDeleteReply',
    replyNote: "its node removes its files, then its record; sandboxes made from it are not touched",
    errors: ['INVALID_REQUEST', 'UNAVAILABLE'],
    limits: '',
    timeout: '60 s',
    retry: 'safe to retry: an absent snapshot answers `deleted: false`',
    queue: 'pdk-placement',
  },
  {
    subject: 'pdk.v1.group.<group>.<verb>',
    kind: 'request',
    request: 'Empty',
    reply: 'GroupReply',
    replyNote: 'verb: pause, resume, hibernate, restore or kill; summed over every node',
    errors: ['INVALID_REQUEST', 'UNKNOWN_VERB'],
    limits: '',
    timeout: '610 s (killing thousands takes minutes)',
    retry: 'safe to retry: sandboxes already there count as done',
    queue: 'pdk-placement',
  },
  {
    subject: 'pdk.v1.rollouts.start',
    kind: 'request',
    request: 'RolloutsStartRequest',
    reply: 'RolloutView',
    errors: ['INVALID_REQUEST', 'INVALID_SPEC', 'ALREADY_EXISTS', 'NO_CAPACITY', 'UNAVAILABLE'],
    limits: '',
    timeout: '140 s (it creates a sandbox)',
    retry: 'with the same rolloutId: ALREADY_EXISTS means it was started — attach',
    queue: 'pdk-placement',
  },
  {
    subject: 'pdk.v1.rollouts.attach',
    kind: 'request',
    request: 'RolloutsAttachRequest',
    reply: 'RolloutView',
    replyNote: 'with prefetch, the last record of each step (first page; `next` → rollouts.steps)',
    errors: ['INVALID_REQUEST', 'NOT_FOUND', 'UNAVAILABLE'],
    limits: 'steps: at most one NATS message per page',
    timeout: '60 s',
    retry: 'safe to retry',
    queue: 'pdk-placement',
  },
  {
    subject: 'pdk.v1.rollouts.get',
    kind: 'request',
    request: 'RolloutsGetRequest',
    reply: 'RolloutRecord',
    errors: ['INVALID_REQUEST', 'NOT_FOUND', 'UNAVAILABLE'],
    limits: '',
    timeout: '10 s',
    retry: 'safe to retry',
    queue: 'pdk-placement',
  },
  {
    subject: 'pdk.v1.rollouts.steps',
    kind: 'request',
    request: 'RolloutsStepsRequest',
    reply: 'RolloutsStepsReply',
    errors: ['INVALID_REQUEST', 'NOT_FOUND', 'UNAVAILABLE'],
    limits: 'one NATS message per page (whole steps)',
    timeout: '60 s',
    retry: 'safe to retry',
    queue: 'pdk-placement',
  },
  {
    subject: 'pdk.v1.rollouts.export',
    kind: 'request',
    request: 'RolloutsExportRequest',
    reply: 'RolloutsExportReply',
    errors: ['INVALID_REQUEST', 'NOT_FOUND', 'UNAVAILABLE'],
    limits: 'one NATS message per page',
    timeout: '60 s',
    retry: 'safe to retry',
    queue: 'pdk-placement',
  },
  {
    subject: 'pdk.v1.rollouts.delete',
    kind: 'request',
    request: 'RolloutsDeleteRequest',
    reply: 'RolloutsDeleteReply',
    errors: ['INVALID_REQUEST', 'UNAVAILABLE'],
    limits: '',
    timeout: '60 s',
    retry: 'safe to retry',
    queue: 'pdk-placement',
  },
  {
    subject: 'pdk.v1.nodes.list',
    kind: 'request',
    request: 'NodesListRequest',
    reply: 'NodesListReply',
    errors: ['INVALID_REQUEST', 'UNAVAILABLE'],
    limits: REQ,
    timeout: '10 s',
    retry: 'safe to retry',
    queue: 'pdk-placement',
  },
  {
    subject: 'pdk.v1.node.<node>.info',
    kind: 'request',
    request: 'Empty',
    reply: 'NodeInfoReply',
    errors: [],
    limits: REQ,
    timeout: '10 s',
    retry: 'safe to retry; no responders: the node is not running',
  },
  {
    subject: 'pdk.v1.node.<node>.drain',
    kind: 'request',
    request: 'DrainRequest',
    reply: 'DrainReply',
    replyNote: 'the node record as it is now (state `draining`); a draining node takes no new sandboxes, and its sandboxes keep running, except with `migrate` those created `migratable`: each is moved to another node before the answer (`migrated`, or `notMigrated` with why)',
    errors: ['INVALID_REQUEST', 'UNAVAILABLE'],
    limits: REQ,
    timeout: '10 s; with `migrate` 10 min (each move snapshots the files and makes a sandbox)',
    retry: 'safe to retry (idempotent): sandboxes already moved are not moved again',
  },
  {
    subject: 'pdk.v1.node.<node>.undrain',
    kind: 'request',
    request: 'Empty',
    reply: 'NodeRecord',
    replyNote: 'the node record as it is now (state `serving`)',
    errors: ['UNAVAILABLE'],
    limits: REQ,
    timeout: '10 s',
    retry: 'safe to retry (idempotent)',
  },
  {
    subject: 'pdk.v1.node.<node>.create',
    kind: 'request',
    request: 'CreateRequest',
    reply: 'CreateReply',
    replyNote: "placement's call to the node it chose; clients call `pdk.v1.place.create`",
    errors: ['INVALID_REQUEST', 'INVALID_SPEC', 'NOT_FOUND', 'PAYLOAD_TOO_LARGE', 'NO_CAPACITY', 'ALREADY_EXISTS', 'TIMEOUT', 'BACKEND_FAILED', 'UNAVAILABLE'],
    limits: `request ≤ ${Limits.createBytesMax / 1024} KiB`,
    timeout: '130 s',
    retry: 'with the same `id`: a node answers a create of an id it made with that sandbox',
  },
  {
    subject: 'pdk.v1.node.<node>.group',
    kind: 'request',
    request: 'NodeGroupRequest',
    reply: 'GroupReply',
    replyNote: "placement's fan-out of `pdk.v1.group.<group>.<verb>` to each node; clients call that",
    errors: ['INVALID_REQUEST'],
    limits: REQ,
    timeout: '600 s',
    retry: 'safe to retry',
  },
  {
    subject: 'pdk.v1.node.<node>.snapshots.delete',
    kind: 'request',
    request: 'SnapshotsDeleteRequest',
    reply: 'SnapshotsDeleteReply',
    replyNote: "placement's call to the node whose disk holds the snapshot; clients call `pdk.v1.snapshots.delete`",
    errors: ['INVALID_REQUEST'],
    limits: REQ,
    timeout: '60 s',
    retry: 'safe to retry: a snapshot the node does not hold answers `deleted: false`',
  },
  {
    subject: 'pdk.v1.fn.invoke',
    kind: 'request',
    request: 'FnInvokeRequest',
    reply: 'FnInvokeResult',
    errors: ['INVALID_REQUEST', 'INVALID_SPEC', 'PAYLOAD_TOO_LARGE', 'BUSY', 'UNAVAILABLE'],
    limits: `${REQ}; ≤ ${Limits.fn.tests} tests, ${Limits.fn.files} files`,
    timeout: 'wallMs × tests + 10 s',
    retry: 'BUSY: after detail.retryAfterMs; a run has no side effects outside its sandbox',
    queue: 'pdk-fn',
  },
];

/** Which payload fields are bytes, and how they travel. */
const BYTES_NOTE = 'bytes: MessagePack bin on NATS; base64 (contentEncoding) in JSON';

// biome-ignore lint/suspicious/noExplicitAny: JSON Schema is untyped JSON
type Json = any;

/** A TypeBox schema as portable JSON Schema: bytes as base64 strings, `$ref`s into `$defs`, defaults not required. */
function portable(schema: TSchema, top: boolean): Json {
  const s: Json = JSON.parse(JSON.stringify(schema));
  const walk = (n: Json, isTop: boolean): Json => {
    if (Array.isArray(n)) return n.map((x) => walk(x, false));
    if (typeof n !== 'object' || n === null) return n;
    if (!isTop && typeof n.$id === 'string' && NamedSchemas[n.$id]) return { $ref: `#/$defs/${n.$id}` };
    const out: Json = {};
    for (const [k, v] of Object.entries(n)) {
      if (k === 'errorMessage' || k === '$id') continue;
      if (k === 'errorCode') out['x-error-code'] = v;
      else if (k === '$ref') out.$ref = `#/$defs/${v}`;
      else out[k] = walk(v, false);
    }
    if (out.type === 'Uint8Array') {
      out.type = 'string';
      out.contentEncoding = 'base64';
      out['x-bytes'] = true;
      if (out.maxByteLength !== undefined) {
        out['x-max-bytes'] = out.maxByteLength;
        delete out.maxByteLength;
      }
    }
    if (out.type === 'object' && Array.isArray(out.required) && out.properties) {
      const required = out.required.filter((k: string) => out.properties[k]?.default === undefined);
      if (required.length > 0) out.required = required;
      else delete out.required;
    }
    return out;
  };
  return walk(s, top);
}

/** The JSON Schema document of the protocol: every message under `$defs`, every operation under `x-operations`. */
export function protocolJsonSchema(): Json {
  const defs: Json = {};
  for (const [name, schema] of Object.entries(NamedSchemas)) defs[name] = portable(schema, true);
  return {
    $schema: 'https://json-schema.org/draft/2020-12/schema',
    $id: 'https://paddock.dev/protocol/v1/schema.json',
    title: 'Paddock wire protocol v1',
    description: `Every payload is a MessagePack map (msgpack with plain maps); a reply is {ok: true, result} or {ok: false, error: WireError}. ${BYTES_NOTE}. Generated from protocol/schema.ts: do not edit.`,
    'x-envelope': { ok: { ok: true, result: '<reply>' }, error: { ok: false, error: { $ref: '#/$defs/WireError' } } },
    'x-error-codes': ErrorCodes,
    'x-limits': { requestBytes: Limits.requestBytesMax, createBytes: Limits.createBytesMax, fileChunkBytes: Limits.files.chunkMax, stdinBytes: Limits.exec.stdinMax, natsMaxPayloadNeeded: Limits.requestBytesMax + MiB },
    'x-operations': Operations,
    $defs: defs,
  };
}

const cell = (s: string) => s.replace(/\|/g, '\\|');

/** The README's per-verb table (between the `protocol-table` markers). */
export function protocolTable(): string {
  const rows = Operations.map((o) => {
    const reply = `\`${o.reply}\`${o.replyNote ? `: ${o.replyNote}` : ''}`;
    return `| \`${cell(o.subject)}\`${o.queue ? ` (any of \`${o.queue}\`)` : ''} | \`${o.request}\` | ${cell(reply)} | ${o.errors.map((e) => `\`${e}\``).join(' ')} | ${cell(o.limits || '—')} | ${cell(o.timeout)} | ${cell(o.retry)} |`;
  });
  return [
    '| subject | request | reply | errors | limits | client timeout | retry |',
    '| --- | --- | --- | --- | --- | --- | --- |',
    ...rows,
    '',
    `Field by field, with types, bounds and defaults: \`protocol/schema.json\` (generated from \`protocol/schema.ts\`; ${BYTES_NOTE}).`,
  ].join('\n');
}

export const TABLE_BEGIN = '<!-- protocol-table:begin (generated by `npm run gen:protocol`; do not edit) -->';
export const TABLE_END = '<!-- protocol-table:end -->';

/** `readme` with its protocol table replaced by the current one. */
export function withProtocolTable(readme: string): string {
  const a = readme.indexOf(TABLE_BEGIN);
  const b = readme.indexOf(TABLE_END);
  if (a < 0 || b < a) throw new Error('README has no protocol-table markers');
  return `${readme.slice(0, a + TABLE_BEGIN.length)}\n${protocolTable()}\n${readme.slice(b)}`;
}

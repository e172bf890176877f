/**
 * The sandbox verb table: for each verb on `pdk.v1.sb.<id>.<verb>`, the states it is answered in,
 * whether it needs the sandbox running (and so wakes a sleeping one that has `autoResume`, and
 * counts as activity for the idle timer), which backend capability it needs, and the names of its
 * request and reply messages. The sandbox machine, its host and the SDK all read this one table: a
 * new verb is a new row here and its handler in actors/sandbox-host.ts.
 */
import type { SandboxState } from './messages.ts';

/** What only some backends do; a verb that needs one is refused on a backend without it. */
export const Capabilities = ['network', 'stats', 'snapshot', 'display', 'ports', 'processes'] as const;
export type Capability = (typeof Capabilities)[number];

export interface VerbRow {
  /** States in which the verb is answered; anything else gets INVALID_STATE. */
  readonly states: readonly SandboxState[];
  /** Runs something in the sandbox: it must be running, a sleeping one is woken (autoResume), and it counts as activity. */
  readonly wakes: boolean;
  readonly capability?: Capability;
  /** Message names in protocol/messages.ts. */
  readonly request: string;
  readonly reply: string;
}

const RUNNING: readonly SandboxState[] = ['running'];
const ASLEEP: readonly SandboxState[] = ['pausing', 'paused', 'resuming', 'hibernating', 'hibernated', 'restoring'];
const LIVE: readonly SandboxState[] = [...RUNNING, ...ASLEEP];
const ANY: readonly SandboxState[] = ['creating', ...LIVE, 'stopping', 'stopped', 'failed'];

export const SandboxVerbTable = {
  info: { states: ANY, wakes: false, request: 'InfoRequest', reply: 'SandboxInfo' },
  exec: { states: RUNNING, wakes: true, request: 'ExecRequest', reply: 'ExecResult' },
  'exec.cancel': { states: [...LIVE, 'stopping'], wakes: false, request: 'ExecCancelRequest', reply: 'ExecCancelReply' },
  'exec.resume': { states: [...LIVE, 'stopping'], wakes: false, request: 'ExecResumeRequest', reply: 'ExecResumeReply' },
  'exec.credit': { states: [...LIVE, 'stopping'], wakes: false, request: 'ExecCreditRequest', reply: 'Empty' },
  'files.read': { states: RUNNING, wakes: true, request: 'FilesReadRequest', reply: 'FilesReadReply' },
  'files.write': { states: RUNNING, wakes: true, request: 'FilesWriteRequest', reply: 'FilesWriteReply' },
  'files.list': { states: RUNNING, wakes: true, request: 'FilesListRequest', reply: 'FilesListReply' },
  'files.remove': { states: RUNNING, wakes: true, request: 'FilesRemoveRequest', reply: 'Empty' },
  'files.upload': { states: RUNNING, wakes: true, request: 'FilesUploadRequest', reply: 'FilesUploadReply' },
  'files.download': { states: RUNNING, wakes: true, request: 'FilesDownloadRequest', reply: 'FilesDownloadReply' },
  'files.watch': { states: RUNNING, wakes: true, request: 'FilesWatchRequest', reply: 'FileWatchEvent' },
  'files.watch.renew': { states: [...LIVE, 'stopping'], wakes: false, request: 'FilesWatchLeaseRequest', reply: 'FilesWatchLeaseReply' },
  'files.watch.cancel': { states: [...LIVE, 'stopping'], wakes: false, request: 'FilesWatchLeaseRequest', reply: 'FilesWatchLeaseReply' },
  kill: { states: ANY, wakes: false, request: 'KillRequest', reply: 'SandboxInfo' },
  pause: { states: LIVE, wakes: false, request: 'SleepRequest', reply: 'SandboxInfo' },
  resume: { states: LIVE, wakes: false, request: 'Empty', reply: 'SandboxInfo' },
  hibernate: { states: LIVE, wakes: false, request: 'SleepRequest', reply: 'SandboxInfo' },
  restore: { states: LIVE, wakes: false, request: 'Empty', reply: 'SandboxInfo' },
  'network.set': { states: LIVE, wakes: false, capability: 'network', request: 'NetworkSetRequest', reply: 'NetworkSetReply' },
  stats: { states: LIVE, wakes: false, capability: 'stats', request: 'Empty', reply: 'SandboxStats' },
  'display.screenshot': { states: RUNNING, wakes: true, capability: 'display', request: 'Empty', reply: 'Screenshot' },
  'display.view': { states: LIVE, wakes: false, capability: 'display', request: 'DisplayViewRequest', reply: 'DisplayViewReply' },
  'display.action': { states: RUNNING, wakes: true, capability: 'display', request: 'ComputerAction', reply: 'ComputerReply' },
  // Background processes and terminals. Reading what they wrote and listing them needs no CPU of
  // the sandbox, so a sleeping one is not woken for it, and they go on while it stops (a reader sees
  // the exits its end brings); signalling and typing wake it.
  'process.start': { states: RUNNING, wakes: true, capability: 'processes', request: 'ProcessStartRequest', reply: 'ProcessInfo' },
  'process.list': { states: [...LIVE, 'stopping'], wakes: false, capability: 'processes', request: 'Empty', reply: 'ProcessListReply' },
  'process.get': { states: [...LIVE, 'stopping'], wakes: false, capability: 'processes', request: 'ProcessGetRequest', reply: 'ProcessInfo' },
  'process.wait': { states: [...LIVE, 'stopping'], wakes: false, capability: 'processes', request: 'ProcessWaitRequest', reply: 'ProcessInfo' },
  'process.kill': { states: RUNNING, wakes: true, capability: 'processes', request: 'ProcessKillRequest', reply: 'ProcessInfo' },
  'process.input': { states: RUNNING, wakes: true, capability: 'processes', request: 'ProcessInputRequest', reply: 'Empty' },
  'process.resize': { states: RUNNING, wakes: true, capability: 'processes', request: 'ProcessResizeRequest', reply: 'Empty' },
  'process.output': { states: [...LIVE, 'stopping'], wakes: false, capability: 'processes', request: 'ProcessOutputRequest', reply: 'ProcessEvent' },
  'process.output.cancel': { states: [...LIVE, 'stopping'], wakes: false, capability: 'processes', request: 'ProcessOutputCancelRequest', reply: 'ProcessOutputCancelReply' },
  'process.output.credit': { states: [...LIVE, 'stopping'], wakes: false, capability: 'processes', request: 'ProcessOutputCreditRequest', reply: 'Empty' },
  snapshot: { states: RUNNING, wakes: true, capability: 'snapshot', request: 'Empty', reply: 'SnapshotInfo' },
  fork: { states: RUNNING, wakes: true, capability: 'snapshot', request: 'ForkRequest', reply: 'ForkReply' },
  'ports.connect': { states: RUNNING, wakes: true, capability: 'ports', request: 'PortsConnectRequest', reply: 'PortEvent' },
  'ports.send': { states: RUNNING, wakes: true, capability: 'ports', request: 'PortsSendRequest', reply: 'Empty' },
  'ports.close': { states: [...LIVE, 'stopping'], wakes: false, capability: 'ports', request: 'PortsCloseRequest', reply: 'PortsCloseReply' },
  'ports.credit': { states: [...LIVE, 'stopping'], wakes: false, capability: 'ports', request: 'PortsCreditRequest', reply: 'Empty' },
  'ports.url': { states: RUNNING, wakes: true, capability: 'ports', request: 'PortsUrlRequest', reply: 'PortsUrlReply' },
} as const satisfies Record<string, VerbRow>;

export type SandboxVerb = keyof typeof SandboxVerbTable;

export const SandboxVerbs = Object.keys(SandboxVerbTable) as SandboxVerb[];

export function verbRow(verb: SandboxVerb): VerbRow {
  return SandboxVerbTable[verb];
}

export function isSandboxVerb(v: string): v is SandboxVerb {
  return Object.hasOwn(SandboxVerbTable, v);
}

/** Whether `verb` is answered in `state`. */
export function verbAllowed(state: SandboxState, verb: SandboxVerb): boolean {
  return (SandboxVerbTable[verb].states as readonly SandboxState[]).includes(state);
}

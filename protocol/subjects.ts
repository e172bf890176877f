/**
 * Every NATS subject, queue group and KV bucket Paddock uses. Servers, the SDK, the CLI and the
 * docs all take names from here.
 */
export const PREFIX = 'pdk.v1';

/** Queue group of placement replicas: any one answers a create. */
export const PLACEMENT_QUEUE = 'pdk-placement';

/** Queue group of the nodes' FnCall services: any one node answers an invocation. */
export const FN_QUEUE = 'pdk-fn';

export const Buckets = {
  /** node id → NodeRecord (heartbeat with capacity). */
  nodes: 'pdk_nodes',
  /** sandbox id → SandboxRecord (node, state, spec summary). */
  sandboxes: 'pdk_sandboxes',
  /** rollout id → RolloutRecord (its sandbox, log retention): see chronus/. */
  rollouts: 'pdk_rollouts',
  /** snapshot id → SnapshotInfo: which node's disk holds each snapshot of a VM sandbox. */
  snapshots: 'pdk_snapshots',
  /** The bridge's leader lease (`leader` → {owner, ts}): one bridge replica acts at a time. */
  bridge: 'pdk_bridge',
} as const;

/** JetStream streams (file storage). */
export const Streams = {
  /** The command log: every step of every rollout, on `pdk.v1.chronus.<rolloutId>.<step>`. */
  chronus: 'PDK_CHRONUS',
} as const;

import type { SandboxVerb } from './verbs.ts';

export type { SandboxVerb } from './verbs.ts';
/** Verbs a sandbox actor answers on `pdk.v1.sb.<id>.<verb>`: the rows of the verb table (verbs.ts). */
export { isSandboxVerb, SandboxVerbs } from './verbs.ts';

/** Verbs a node supervisor answers on `pdk.v1.node.<node>.<verb>`. */
export const NodeVerbs = ['create', 'info', 'group', 'drain', 'undrain', 'snapshots.delete'] as const;
export type NodeVerb = (typeof NodeVerbs)[number];

/** Calls on the command log (`pdk.v1.rollouts.<verb>`), answered by placement replicas. */
export const RolloutVerbs = ['start', 'attach', 'get', 'steps', 'export', 'delete'] as const;
export type RolloutVerb = (typeof RolloutVerbs)[number];

// Ids become subject tokens: keep them to a safe alphabet so no id can inject a wildcard or a dot.
const TOKEN = /^[A-Za-z0-9_-]{1,64}$/;
export function isToken(s: unknown): s is string {
  return typeof s === 'string' && TOKEN.test(s);
}

export const subjects = {
  placeCreate: `${PREFIX}.place.create`,
  /** Which creates in flight a placement replica holds: every replica subscribes (no queue); only holders answer. */
  placePending: `${PREFIX}.place.pending`,
  /** The sandbox directory: list (filters, pages) and get, answered by placement replicas. */
  sandboxesList: `${PREFIX}.sandboxes.list`,
  sandboxesGet: `${PREFIX}.sandboxes.get`,
  /** Snapshots of VM sandboxes: list (from `pdk_snapshots`) and delete (forwarded to the owning node), answered by placement replicas. */
  snapshotsList: `${PREFIX}.snapshots.list`,
  snapshotsDelete: `${PREFIX}.snapshots.delete`,
  rollouts: (verb: RolloutVerb) => `${PREFIX}.rollouts.${verb}`,
  /** FnCall: one-shot invocations, answered by any node (queue group FN_QUEUE). */
  fnInvoke: `${PREFIX}.fn.invoke`,
  node: (node: string, verb: NodeVerb) => `${PREFIX}.node.${node}.${verb}`,
  /** The node table (placement replicas answer, from the `pdk_nodes` bucket): `node list` without reading the bucket. */
  nodeList: `${PREFIX}.nodes.list`,
  sandbox: (id: string, verb: SandboxVerb) => `${PREFIX}.sb.${id}.${verb}`,
  /** Everything addressed to one sandbox; its actor subscribes here. */
  sandboxAll: (id: string) => `${PREFIX}.sb.${id}.>`,
  event: (id: string, state: string) => `${PREFIX}.evt.${id}.${state}`,
  /** Acts on every sandbox of a training job, on all nodes; answered by placement replicas. */
  group: (group: string, verb: string) => `${PREFIX}.group.${group}.${verb}`,
  groupAll: `${PREFIX}.group.*.*`,
  /** All lifecycle events of one sandbox (or `*` for all). */
  events: (id = '*') => `${PREFIX}.evt.${id}.*`,
  /** One step of a rollout in the command log. */
  chronusStep: (rolloutId: string, step: number) => `${PREFIX}.chronus.${rolloutId}.${step}`,
  /** Every step of one rollout. */
  chronusRollout: (rolloutId: string) => `${PREFIX}.chronus.${rolloutId}.*`,
  chronusAll: `${PREFIX}.chronus.>`,
  /**
   * The bridge (bridge/): placement publishes the creates it holds on `demand`; the leading bridge
   * publishes `state` (whether capacity can come, and if not why) every second, each `decision`
   * with its reason, and answers `status`.
   */
  bridgeDemand: `${PREFIX}.bridge.demand`,
  bridgeState: `${PREFIX}.bridge.state`,
  bridgeDecision: `${PREFIX}.bridge.decision`,
  bridgeStatus: `${PREFIX}.bridge.status`,
  bridgeAll: `${PREFIX}.bridge.>`,
} as const;

/** Splits `pdk.v1.sb.<id>.<verb...>` into id and verb; null for anything else. */
export function parseSandboxSubject(subject: string): { id: string; verb: string } | null {
  const head = `${PREFIX}.sb.`;
  if (!subject.startsWith(head)) return null;
  const rest = subject.slice(head.length);
  const dot = rest.indexOf('.');
  if (dot <= 0) return null;
  return { id: rest.slice(0, dot), verb: rest.slice(dot + 1) };
}

/** Splits `pdk.v1.group.<group>.<verb>` into group and verb; null for anything else. */
export function parseGroupSubject(subject: string): { group: string; verb: string } | null {
  const head = `${PREFIX}.group.`;
  if (!subject.startsWith(head)) return null;
  const rest = subject.slice(head.length);
  const dot = rest.indexOf('.');
  if (dot <= 0) return null;
  return { group: rest.slice(0, dot), verb: rest.slice(dot + 1) };
}

/**
 * A subject with its variable tokens named (`pdk.v1.sb.{id}.exec`, `pdk.v1.node.{node}.create`):
 * what span names and `messaging.destination.template` carry, so that every sandbox's exec is one
 * operation in a trace backend, not one per sandbox. `op` is the verb (or the subject's last part).
 */
export function subjectTemplate(subject: string): { template: string; op: string; sandbox?: string } {
  const sb = parseSandboxSubject(subject);
  if (sb) return { template: `${PREFIX}.sb.{id}.${sb.verb}`, op: sb.verb, sandbox: sb.id };
  const g = parseGroupSubject(subject);
  if (g) return { template: `${PREFIX}.group.{group}.${g.verb}`, op: `group.${g.verb}` };
  for (const [kind, name] of [
    ['node', 'node'],
    ['evt', 'id'],
    ['chronus', 'rollout'],
  ] as const) {
    const head = `${PREFIX}.${kind}.`;
    if (!subject.startsWith(head)) continue;
    const rest = subject.slice(head.length);
    const dot = rest.indexOf('.');
    if (dot <= 0) break;
    const tail = rest.slice(dot + 1);
    return { template: `${head}{${name}}.${kind === 'chronus' ? '{step}' : tail}`, op: kind === 'node' ? `node.${tail}` : kind };
  }
  const op = subject.startsWith(`${PREFIX}.`) ? subject.slice(PREFIX.length + 1) : subject;
  return { template: subject, op };
}

/**
 * Operations (subjectTemplate's `op`) a client may send again when its connection dropped while
 * one was in flight: reads, and calls whose second delivery does what the first did — a create
 * carries its sandbox id, which makes it idempotent (a node that has it answers with it, another
 * finds the id taken), a group verb counts sandboxes already there as done. test/protocol.test.ts
 * keeps this in step with the `retry` column of protocol/api.ts.
 */
const RESENDABLE = new Set([
  'place.create',
  'place.pending',
  'sandboxes.list',
  'sandboxes.get',
  'info',
  'exec.cancel',
  'exec.resume',
  'exec.credit',
  'files.read',
  'files.list',
  // Numbered chunks: one sent again is answered again, never applied twice.
  'files.upload',
  'files.download',
  'files.watch.renew',
  'files.watch.cancel',
  'stats',
  'display.screenshot',
  'display.view',
  'ports.close',
  'ports.credit',
  'ports.url',
  'kill',
  'network.set',
  'process.list',
  'process.get',
  'process.wait',
  'process.resize',
  'process.output.cancel',
  'process.output.credit',
  'rollouts.attach',
  'rollouts.get',
  'rollouts.steps',
  'rollouts.export',
  'rollouts.delete',
  'nodes.list',
  'snapshots.list',
  'snapshots.delete',
  'node.snapshots.delete',
  'node.info',
  'node.create',
  // Setting a state it may already be in, and a group verb that counts sandboxes already there as done.
  'node.drain',
  'node.undrain',
  'node.group',
]);

export function mayResend(op: string): boolean {
  return RESENDABLE.has(op) || op.startsWith('group.');
}

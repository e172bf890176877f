/**
 * Every NATS subject, queue group and KV bucket Paddock uses. Servers, the SDK, the CLI and the
 * docs all take names from here.
 */
export const PREFIX = 'pdk.v1';

/** Queue group of placement replicas: any one answers a create. */
export const PLACEMENT_QUEUE = 'pdk-placement';

export const Buckets = {
  /** node id → NodeRecord (heartbeat with capacity). */
  nodes: 'pdk_nodes',
  /** sandbox id → SandboxRecord (node, state, spec summary). */
  sandboxes: 'pdk_sandboxes',
} as const;

/** Verbs a sandbox actor answers on `pdk.v1.sb.<id>.<verb>`. */
export const SandboxVerbs = ['info', 'exec', 'exec.cancel', 'files.read', 'files.write', 'files.list', 'files.remove', 'kill', 'pause', 'resume', 'hibernate', 'restore'] as const;
export type SandboxVerb = (typeof SandboxVerbs)[number];

export function isSandboxVerb(v: string): v is SandboxVerb {
  return (SandboxVerbs as readonly string[]).includes(v);
}

/** Verbs a node supervisor answers on `pdk.v1.node.<node>.<verb>`. */
export const NodeVerbs = ['create', 'info', 'group'] as const;
export type NodeVerb = (typeof NodeVerbs)[number];

// Ids become subject tokens: keep them to a safe alphabet so no id can inject a wildcard or a dot.
const TOKEN = /^[A-Za-z0-9_-]{1,64}$/;
export function isToken(s: unknown): s is string {
  return typeof s === 'string' && TOKEN.test(s);
}

export const subjects = {
  placeCreate: `${PREFIX}.place.create`,
  node: (node: string, verb: NodeVerb) => `${PREFIX}.node.${node}.${verb}`,
  sandbox: (id: string, verb: SandboxVerb) => `${PREFIX}.sb.${id}.${verb}`,
  /** Everything addressed to one sandbox; its actor subscribes here. */
  sandboxAll: (id: string) => `${PREFIX}.sb.${id}.>`,
  event: (id: string, state: string) => `${PREFIX}.evt.${id}.${state}`,
  /** Acts on every sandbox of a training job, on all nodes; answered by placement replicas. */
  group: (group: string, verb: string) => `${PREFIX}.group.${group}.${verb}`,
  groupAll: `${PREFIX}.group.*.*`,
  /** All lifecycle events of one sandbox (or `*` for all). */
  events: (id = '*') => `${PREFIX}.evt.${id}.*`,
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

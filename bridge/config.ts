/**
 * The bridge's policy from the environment (PADDOCK_BRIDGE_*). A provider is what turns the
 * bridge on: with PADDOCK_BRIDGE_PROVIDER unset, `npm start` runs no bridge.
 */
import type { Policy, Shape } from './machine.ts';

export const BRIDGE_ENV_DOC: Record<string, string> = {
  PADDOCK_BRIDGE_PROVIDER: 'bridge: the provider plugin that adds machines (local, ssh); unset: no bridge',
  PADDOCK_BRIDGE_SHAPE: 'bridge: what one machine offers, cpu=N,memory=MiB,sandboxes=N (default cpu=16,memory=16384,sandboxes=64)',
  PADDOCK_BRIDGE_MAX_MACHINES: 'bridge: machines it runs at most (default 4)',
  PADDOCK_BRIDGE_BUDGET: 'bridge: machines it may start over its life (default: no limit)',
  PADDOCK_BRIDGE_HEADROOM: 'bridge: extra share of the demand to add, e.g. 0.25 (default 0)',
  PADDOCK_BRIDGE_COOLDOWN_MS: 'bridge: after machines join, how long placement fills them before the next decision (default 1000)',
  PADDOCK_BRIDGE_IDLE_MS: 'bridge: a machine with no sandbox this long is drained and released (default 60000)',
  PADDOCK_BRIDGE_JOIN_DEADLINE_MS: 'bridge: a machine whose node has not joined by then is released as failed (default 60000)',
  PADDOCK_BRIDGE_BACKOFF_MS: 'bridge: after a provider failure, how long it says no capacity can come (default 10000)',
  PADDOCK_BRIDGE_TAG: 'bridge: the tag on its machines, by which a restarted bridge adopts them (default default)',
  PADDOCK_BRIDGE_NODE_ENV: 'bridge (local, ssh): JSON object of environment for the nodes of its machines',
  PADDOCK_BRIDGE_CPUS: 'bridge (local): CPUs of each machine\'s cgroup share (default 1)',
  PADDOCK_BRIDGE_MEMORY_MIB: 'bridge (local): memory limit of each machine\'s cgroup share (default 1024)',
  PADDOCK_BRIDGE_SSH_HOSTS: 'bridge (ssh): the pool, user@host[:port],… (one machine per host)',
  PADDOCK_BRIDGE_SSH_KEY: 'bridge (ssh): the private key ssh offers (default: ssh\'s own)',
  PADDOCK_BRIDGE_SSH_KNOWN_HOSTS: 'bridge (ssh): known_hosts the hosts\' keys must be in (default: pinned on first use in $PADDOCK_HOME/bridge/ssh/known_hosts)',
  PADDOCK_BRIDGE_SSH_NODE_CMD: 'bridge (ssh): what runs a node on a host (default paddock node)',
  PADDOCK_BRIDGE_SSH_DIR: 'bridge (ssh): the provider\'s directory on each host, under the login\'s home when relative (default .paddock-bridge)',
};

function num(env: NodeJS.ProcessEnv, k: string, d: number): number {
  const v = env[k];
  if (v === undefined || v === '') return d;
  const n = Number(v);
  if (!Number.isFinite(n) || n < 0) throw new Error(`${k}: must be a number ≥ 0, got ${JSON.stringify(v)}`);
  return n;
}

export function parseShape(s: string): Shape {
  const shape: Shape = { cpu: 16, memoryMiB: 16384, sandboxes: 64 };
  for (const part of s.split(',').filter(Boolean)) {
    const [k, v] = part.split('=');
    const n = Number(v);
    if (!(n > 0)) throw new Error(`PADDOCK_BRIDGE_SHAPE: ${part}: must be key=positive number`);
    if (k === 'cpu') shape.cpu = n;
    else if (k === 'memory') shape.memoryMiB = n;
    else if (k === 'sandboxes') shape.sandboxes = n;
    else throw new Error(`PADDOCK_BRIDGE_SHAPE: unknown key ${k} (cpu, memory, sandboxes)`);
  }
  return shape;
}

export function policyFromEnv(env: NodeJS.ProcessEnv = process.env): Policy {
  return {
    shape: parseShape(env.PADDOCK_BRIDGE_SHAPE ?? ''),
    maxMachines: num(env, 'PADDOCK_BRIDGE_MAX_MACHINES', 4),
    budgetMachines: num(env, 'PADDOCK_BRIDGE_BUDGET', Number.POSITIVE_INFINITY),
    headroom: num(env, 'PADDOCK_BRIDGE_HEADROOM', 0),
    cooldownMs: num(env, 'PADDOCK_BRIDGE_COOLDOWN_MS', 1000),
    idleMs: num(env, 'PADDOCK_BRIDGE_IDLE_MS', 60_000),
    joinDeadlineMs: num(env, 'PADDOCK_BRIDGE_JOIN_DEADLINE_MS', 60_000),
    failureBackoffMs: num(env, 'PADDOCK_BRIDGE_BACKOFF_MS', 10_000),
  };
}

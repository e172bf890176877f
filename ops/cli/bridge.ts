/**
 * `paddock bridge status` (the leading bridge's machines, demand and last decisions) and
 * `paddock node drain|undrain <id>` (cordon a node by hand: placement skips it, its sandboxes run on).
 */
import { RequestError } from '@nats-io/transport-node';
import type { BridgeStatus } from '../../bridge/host.ts';
import { decode, encode, isToken, type Reply, subjects } from '../../protocol/index.ts';
import { connectionOf } from '../../sdk/client.ts';
import type { Paddock } from '../../sdk/index.ts';
import type { Args } from './args.ts';
import { age, json, out, table, UsageError, withClient } from './common.ts';

async function ask<T>(pdk: Paddock, subject: string, timeout: number): Promise<T> {
  const nc = connectionOf(pdk);
  const m = await nc.request(subject, encode({}), { timeout });
  const r = decode(m.data) as Reply<T>;
  if (!r.ok) throw new Error(`${r.error.code}: ${r.error.message}`);
  return r.result;
}

export async function bridgeCli(a: Args): Promise<number> {
  const [verb, ...rest] = a.positionals;
  if (verb !== 'status' || rest.length > 0) throw new UsageError('usage: paddock bridge status [--json]');
  return withClient(a.values, async (pdk) => {
    let s: BridgeStatus;
    try {
      s = await ask<BridgeStatus>(pdk, subjects.bridgeStatus, 3000);
    } catch (err) {
      if (!(err instanceof RequestError && err.isNoResponders())) throw err;
      out('no bridge is leading (none runs: set PADDOCK_BRIDGE_PROVIDER for `paddock up`)');
      return 1;
    }
    if (a.values.json) {
      json(s);
      return 0;
    }
    out(`bridge: ${s.leader} leading, ${s.phase}; ${s.canProvision ? 'can add machines' : `cannot add machines: ${s.reason}`}`);
    out(`provider: ${JSON.stringify(s.provider)}`);
    out(`demand: ${s.demand.count} creates waiting (${s.demand.cpu} CPU, ${s.demand.memoryMiB} MiB); started ${s.started}, failures ${s.failures}`);
    if (s.machines.length > 0) out(table(['MACHINE', 'STATE', 'AGE', 'IN STATE'], s.machines.map((m) => [m.id, m.state, age(m.ageMs), age(m.sinceMs)])));
    if (s.decisions.length > 0) {
      out('last decisions:');
      for (const d of s.decisions.slice(-10)) out(`  ${new Date(d.ts).toISOString()} ${d.action} ${d.machines.join(',')}: ${d.reason}`);
    }
    return 0;
  });
}

export async function nodeVerb(a: Args): Promise<number> {
  const [verb, id, ...rest] = a.positionals;
  const migrate = a.values.migrate === true;
  if ((verb !== 'drain' && verb !== 'undrain') || !isToken(id) || rest.length > 0 || (migrate && verb !== 'drain')) throw new UsageError('usage: paddock node drain [--migrate] <node-id> | paddock node undrain <node-id>');
  return withClient(a.values, async (pdk) => {
    if (migrate) {
      const r = await pdk.nodes.drain(id, { migrate });
      for (const [from, to] of Object.entries(r.migrated ?? {})) out(`${from} → ${to}`);
      for (const [from, why] of Object.entries(r.notMigrated ?? {})) out(`${from} stays: ${why}`);
      out(`node ${id} draining: ${Object.keys(r.migrated ?? {}).length} moved, ${Object.keys(r.notMigrated ?? {}).length} could not move; ${r.sandboxes} run on here`);
      return Object.keys(r.notMigrated ?? {}).length > 0 ? 1 : 0;
    }
    await ask(pdk, subjects.node(id, verb), 5000);
    out(verb === 'drain' ? `node ${id} draining: placement skips it; its sandboxes run on` : `node ${id} serving again`);
    return 0;
  });
}

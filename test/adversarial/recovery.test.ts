/** A node that dies mid-flight leaves links, firewall rules, address claims and lxcfs behind: its next start removes them. */
import { execFile } from 'node:child_process';
import { readdir, readFile } from 'node:fs/promises';
import { promisify } from 'node:util';
import test from 'ava';
import { NFT } from '../../runtime/network/egress.ts';
import { restartNode, startTestCluster, stopTestCluster } from '../helpers/cluster.ts';

const sh = promisify(execFile);

async function claimsOf(node: string): Promise<string[]> {
  const out: string[] = [];
  for (const n of await readdir('/run/paddock-net').catch(() => [] as string[])) {
    if ((await readFile(`/run/paddock-net/${n}`, 'utf8').catch(() => '')).startsWith(`${node} `)) out.push(n);
  }
  return out;
}

const linkExists = (index: string) => sh('ip', ['link', 'show', `pdk${index}`]).then(
  () => true,
  () => false,
);
const tableExists = (node: string) => sh(NFT, ['list', 'table', 'inet', `pdk_${node}`]).then(
  () => true,
  () => false,
);

test('a node killed with SIGKILL: its next start removes the links, rules and claims of networked sandboxes', async (t) => {
  const c = await startTestCluster();
  t.teardown(() => stopTestCluster(c));
  const first = c.cluster.nodes[0]!;
  await c.pdk.sandboxes.create({ network: { allow: ['198.18.0.1/32:443'] } });
  await c.pdk.sandboxes.create({ network: { domains: ['example.test'] } });
  const claims = await claimsOf(first.id);
  t.is(claims.length, 2);
  t.true(await tableExists(first.id));
  const lxcfsPid = Number((await readFile(`${c.home}/nodes/${first.id}/lxcfs.pid`, 'utf8').catch(() => '0')).trim());

  first.proc.kill('SIGKILL');
  await first.exited;
  // If the test stops before the restart below, a restart still cleans up (teardowns run last first).
  let restarted = false;
  const restart = async () => {
    if (restarted) return;
    restarted = true;
    c.cluster.nodes[0] = await restartNode(c, first.id);
  };
  t.teardown(restart);
  for (const i of claims) t.true(await linkExists(i), `pdk${i} outlives its node`);
  // lxcfs dies with its node (parent-death signal): it would keep the node's mount namespace alive.
  await new Promise((r) => setTimeout(r, 300));
  // (A zombie counts as gone: its new parent reaps it when it gets to it.)
  const state = lxcfsPid > 1 ? await readFile(`/proc/${lxcfsPid}/stat`, 'utf8').then((st) => st.slice(st.lastIndexOf(')') + 2, st.lastIndexOf(')') + 3), () => 'gone') : 'gone';
  t.true(state === 'gone' || state === 'Z', `lxcfs is ${state}`);

  await restart();
  t.deepEqual(await claimsOf(first.id), []);
  for (const i of claims) t.false(await linkExists(i), `pdk${i} removed`);
  t.false(await tableExists(first.id));
  // And networking works again.
  const sb = await c.pdk.sandboxes.create({ network: { allow: ['198.18.0.1/32:443'] } });
  t.is((await claimsOf(first.id)).length, 1);
  await sb.kill();
  t.deepEqual(await claimsOf(first.id), []);
});

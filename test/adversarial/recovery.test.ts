/** A node that dies mid-flight leaves its sandboxes running with their links, firewall rules, address claims and lxcfs: its next start takes them up. */
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

/** Running, not a zombie waiting for its new parent to reap it. */
async function alive(pid: number): Promise<boolean> {
  if (!(pid > 1)) return false;
  const st = await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => '');
  return st !== '' && st.slice(st.lastIndexOf(')') + 2, st.lastIndexOf(')') + 3) !== 'Z';
}

test('a node killed with SIGKILL: its next start takes its networked sandboxes up with their policies made anew, and what the old node left ends with them', async (t) => {
  const c = await startTestCluster();
  t.teardown(() => stopTestCluster(c));
  const first = c.cluster.nodes[0]!;
  const sbs = [await c.pdk.sandboxes.create({ network: { allow: ['198.18.0.1/32:443'] } }), await c.pdk.sandboxes.create({ network: { domains: ['example.test'] } })];
  const claims = await claimsOf(first.id);
  t.is(claims.length, 2);
  t.true(await tableExists(first.id));
  const lxcfsPid = Number((await readFile(`${c.home}/nodes/${first.id}/lxcfs.pid`, 'utf8').catch(() => '0')).trim());
  t.true(await alive(lxcfsPid));

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
  // The sandboxes read their /proc files through the old lxcfs: it outlives its node too.
  await new Promise((r) => setTimeout(r, 300));
  t.true(await alive(lxcfsPid), 'lxcfs serves on for the sandboxes');

  await restart();
  // The old links, rules and claims are gone; each sandbox has a link and rules of the new node's.
  const again = await claimsOf(first.id);
  t.is(again.length, 2);
  for (const i of claims) if (!again.includes(i)) t.false(await linkExists(i), `pdk${i} removed`);
  for (const i of again) t.true(await linkExists(i));
  t.true(await tableExists(first.id));
  for (const sb of sbs) {
    t.is((await c.pdk.sandboxes.get(sb.id)).info.state, 'running');
    const links = (await sb.exec(['ls', '/sys/class/net'])).stdout.split('\n').filter((l) => l && l !== 'lo');
    t.is(links.length, 1, `a link again: ${links}`);
    t.regex((await sb.exec(['cat', '/proc/meminfo'])).stdout, /^MemTotal/, 'its /proc files through the old lxcfs');
  }
  // Once the last of them is gone, so is everything of the old node's.
  for (const sb of sbs) await sb.kill();
  t.deepEqual(await claimsOf(first.id), []);
  let gone = false;
  for (let i = 0; i < 100 && !gone; i++) {
    gone = !(await alive(lxcfsPid));
    if (!gone) await new Promise((r) => setTimeout(r, 100));
  }
  t.true(gone, 'the old lxcfs ended with the last sandbox that used it');
  // And networking works as before.
  const sb = await c.pdk.sandboxes.create({ network: { allow: ['198.18.0.1/32:443'] } });
  t.is((await claimsOf(first.id)).length, 1);
  await sb.kill();
  t.deepEqual(await claimsOf(first.id), []);
});

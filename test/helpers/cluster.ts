/**
 * Test fixtures: a real nats-server and real node processes per test file, torn down after it.
 * Every file gets its own home directory and node ids, so files run in parallel without sharing
 * crun state, cgroups or mounts. The busybox layer is built once and shared.
 */
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TestFn } from 'ava';
import anyTest from 'ava';
import { type LocalCluster, type NodeProcess, startLocalCluster, startNode } from '../../ops/local.ts';
import { connectionOf } from '../../sdk/client.ts';
import { Paddock } from '../../sdk/index.ts';

import { SHARED_IMAGES } from './paths.ts';

export { SHARED_IMAGES };

let clusters = 0;

export interface ClusterContext {
  cluster: LocalCluster;
  pdk: Paddock;
  home: string;
}

export async function startTestCluster(opts: { nodes?: number; env?: Record<string, string> } = {}): Promise<ClusterContext> {
  const home = await mkdtemp(join(tmpdir(), 'paddock-test-'));
  // Node ids name cgroups and crun state: unique per cluster, even for two clusters in one file.
  const prefix = `t${process.pid}c${++clusters}n`;
  const cluster = await startLocalCluster({ home, nodes: opts.nodes ?? 1, prefix, imagesDir: SHARED_IMAGES, env: { PADDOCK_HEARTBEAT_MS: '500', ...opts.env } });
  try {
    const pdk = await Paddock.connect({ servers: cluster.url, timeoutMs: 60_000 });
    return { cluster, pdk, home };
  } catch (e) {
    // A before hook that fails never reaches the after hook with a cluster to stop.
    await cluster.stop();
    await rm(home, { recursive: true, force: true });
    throw e;
  }
}

export async function stopTestCluster(c: ClusterContext | undefined): Promise<void> {
  if (!c) return;
  // A client that is reconnecting to a NATS a test stopped must not hold the teardown up; nor,
  // once the teardown is done, keep the worker alive for ever (it reconnects without end).
  await Promise.race([c.pdk.close().catch(() => {}), new Promise((r) => setTimeout(r, 5000).unref())]);
  await connectionOf(c.pdk)
    .close()
    .catch(() => {});
  await c.cluster.stop();
  if (!process.env.PADDOCK_TEST_KEEP_HOME) await rm(c.home, { recursive: true, force: true });
}

/**
 * A path in a node's runtime state (its bundles and crun's state), seen through the node's
 * /proc/<pid>/root: `<node>/run` links to a directory on /dev/shm (container/backend.ts hostRunDir).
 */
export function nodeRunPath(home: string, node: { id: string; proc: { pid?: number } }, ...parts: string[]): string {
  return `/proc/${node.proc.pid}/root${join(home, 'nodes', node.id, 'run', ...parts)}`;
}

/** ava bound to a cluster started once per file. */
export function clusterTest(opts: { nodes?: number; env?: Record<string, string> } = {}): TestFn<ClusterContext> {
  const test = anyTest as TestFn<ClusterContext>;
  test.before(async (t) => {
    Object.assign(t.context, await startTestCluster(opts));
  });
  test.afterEach.always(logNodesOnFailure);
  test.after.always(async (t) => {
    await stopTestCluster(t.context.cluster ? t.context : undefined);
  });
  return test;
}

/**
 * Starts node `id` again in a test cluster (after a kill or a stop), as startTestCluster starts
 * them: the shared image store, a fast heartbeat, and no background FnCall image build, which a
 * test's later kill would cut short halfway.
 */
export function restartNode(c: { cluster: LocalCluster; home: string }, id: string, env: Record<string, string> = {}): Promise<NodeProcess> {
  return startNode({ natsUrl: c.cluster.url, home: c.home, id, imagesDir: SHARED_IMAGES, env: { PADDOCK_HEARTBEAT_MS: '500', PADDOCK_FN_BUILD: '0', ...env } });
}

/** A failed test shows its nodes' last warnings and last lines: CI keeps the output, not the homes. */
export async function logNodesOnFailure(t: { passed: boolean; context: Partial<ClusterContext>; log(...values: unknown[]): void }): Promise<void> {
  if (t.passed || !t.context.cluster) return;
  for (const n of t.context.cluster.nodes) {
    const all = (await readFile(n.logFile ?? '', 'utf8').catch(() => '')).split('\n').filter(Boolean);
    const shown = new Set([...all.filter((l) => /"level":(40|50|60)/.test(l)).slice(-20), ...all.slice(-15)]);
    for (const l of all) if (shown.has(l)) t.log(`${n.id}: ${l.slice(0, 400)}`);
  }
}

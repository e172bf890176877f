/**
 * What the floors of the container benchmarks share: a generated bash script that does by hand what
 * Paddock asks crun to do, in a private mount namespace, timing each operation with $EPOCHREALTIME
 * and printing one `<op> <ms>` line per sample. Bash is the cheapest way to start a program short of
 * writing C, so the floor is crun's cost and the kernel's, not a driver's.
 */
import { spawn } from 'node:child_process';
import { chmod, mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { detectCgroups } from '../../runtime/cgroups.ts';
import { onCleanup, progress, removeCgroup, removeHiddenUnified } from './harness.ts';

/**
 * crun refuses a hybrid cgroup host; without the empty cgroup2 in this namespace it sees plain v1.
 * But it still enters each container into the `0::` hierarchy of /proc/self/cgroup by writing
 * `unified/<cgroupsPath>/cgroup.procs` — which, once `unified` is unmounted, is a directory and a
 * file on /sys/fs/cgroup's tmpfs, shared with the host yet hidden there under its cgroup2 mount,
 * and never removed. A private tmpfs over `unified` takes those writes and vanishes with us.
 */
export const HYBRID_PREP = `umount /sys/fs/cgroup/unified
mount -t tmpfs -o mode=755 paddock-bench-unified /sys/fs/cgroup/unified`;

/** Prints "<op> <ms>" from two $EPOCHREALTIME readings, in integer microseconds (bash has no floats). */
export const EMIT_FN = `emit() { local d=$(( \${3/./} - \${2/./} )); printf '%s %d.%03d\\n' "$1" $((d / 1000)) $((d % 1000)); }`;

/** Single-quotes a word for bash. */
export function shq(s: string): string {
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

export type Samples = Map<string, number[]>;

export function parseSamples(stdout: string): Samples {
  const out: Samples = new Map();
  for (const line of stdout.split('\n')) {
    const m = /^([a-z.]+) (\d+\.\d+)$/.exec(line.trim());
    if (!m) continue;
    const [, name, ms] = m as unknown as [string, string, string];
    const list = out.get(name) ?? [];
    list.push(Number(ms));
    out.set(name, list);
  }
  return out;
}

/**
 * Runs a floor script in a private mount namespace (its mounts vanish with it) and returns its
 * samples; fails with the script's last stderr when it exits non-zero or runs past `timeoutMs`.
 * `onLine` sees each stdout line as it comes (progress).
 */
export async function runFloorScript(script: string, timeoutMs: number, onLine?: (line: string) => void): Promise<Samples> {
  // `unshare` execs bash in place, so signalling this child signals the script (its trap cleans up).
  const child = spawn('unshare', ['--mount', '--propagation', 'private', '--', 'bash', script], { stdio: ['ignore', 'pipe', 'pipe'] });
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
  };
  onCleanup('floor script', stop);
  let stdout = '';
  let partial = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => {
    const text = d.toString();
    stdout += text;
    if (!onLine) return;
    const lines = (partial + text).split('\n');
    partial = lines.pop() ?? '';
    for (const l of lines) onLine(l);
  });
  child.stderr.on('data', (d: Buffer) => {
    stderr = (stderr + d.toString()).slice(-8000);
  });
  const timer = setTimeout(() => void stop(), timeoutMs);
  const code = await new Promise<number>((resolve, reject) => {
    child.on('error', reject);
    child.on('close', (c, sig) => resolve(c ?? (sig ? 128 : 1)));
  }).finally(() => clearTimeout(timer));
  if (code !== 0) throw new Error(`floor script exited with ${code}: ${stderr.trim() || '(no stderr)'}`);
  return parseSamples(stdout);
}

/** A floor's working directory, containers and cgroups: made by `prepareFloor`, gone at cleanup. */
export interface FloorBase {
  dir: string;
  crunRoot: string;
  bundles: string;
  /** Parent cgroup of the containers: apart from Paddock's `/paddock/…`, so cleanup cannot touch a node's. */
  cgroup: string;
  ids: string[];
  /** Layer blobs, bottom first (as in the manifest). */
  layers: string[];
  hybrid: boolean;
  /** What crun sees from inside the script's namespace: hybrid becomes plain v1 once `unified` is gone. */
  cgroupMode: 'v1' | 'v2';
}

/** The directory (temp, removed at cleanup), crun's root, N container ids and the cgroup cleanup of a floor. */
export async function prepareFloor(o: { name: string; cgroup: string; n: number; layers: string[] }): Promise<FloorBase> {
  const dir = await mkdtemp(join(tmpdir(), `paddock-bench-${o.name}-`));
  // The containers' root is an unprivileged uid (user namespace): crun must be able to reach the bundles.
  await chmod(dir, 0o711);
  onCleanup('floor files', () => rm(dir, { recursive: true, force: true }));
  onCleanup('floor cgroups', async () => {
    await removeCgroup(o.cgroup);
    // The script's private tmpfs should have taken these; make sure.
    const hidden = await removeHiddenUnified(o.cgroup);
    if (hidden > 0) progress(`floor: removed ${hidden} stray cgroup.procs entries under unified/${o.cgroup}`);
  });
  const host = detectCgroups();
  const base: FloorBase = {
    dir,
    crunRoot: join(dir, 'crun'),
    bundles: join(dir, 'b'),
    cgroup: o.cgroup,
    ids: Array.from({ length: o.n }, (_, i) => `${o.name}${process.pid}-${i}`),
    layers: o.layers,
    hybrid: host === 'hybrid',
    cgroupMode: host === 'v2' ? 'v2' : 'v1',
  };
  await mkdir(base.crunRoot, { recursive: true });
  return base;
}

/**
 * The start of a floor script: strict bash, `root`, `base`, `ids`, `layers`, `n`, `nl` and the
 * script's own `vars`, the hybrid-host preparation and `emit`.
 */
export function scriptHead(b: FloorBase, vars: Record<string, string | number>): string {
  return `#!/usr/bin/env bash
set -euo pipefail
export LC_ALL=C   # $EPOCHREALTIME's decimal separator follows the locale
root=${shq(b.crunRoot)}
base=${shq(b.bundles)}
ids=(${b.ids.map(shq).join(' ')})
layers=(${b.layers.map(shq).join(' ')})
${Object.entries(vars)
  .map(([k, v]) => `${k}=${typeof v === 'number' ? v : shq(v)}`)
  .join('\n')}
n=\${#ids[@]}
nl=\${#layers[@]}

${b.hybrid ? HYBRID_PREP : ': not a hybrid cgroup host'}

${EMIT_FN}
`;
}

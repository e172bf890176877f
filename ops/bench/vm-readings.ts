/** Host-side readings of the QEMU processes a benchmark's node runs (microVMs, full VMs). */
import { closeSync, openSync, readSync } from 'node:fs';
import { readdir, readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';

/** The QEMU processes whose command line names `home`. */
export async function qemuPids(home: string): Promise<number[]> {
  const out: number[] = [];
  for (const d of await readdir('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    const cmd = await readFile(`/proc/${d}/cmdline`, 'utf8').catch(() => '');
    if (cmd.startsWith('qemu-system') && cmd.includes(home)) out.push(Number(d));
  }
  return out;
}

/** The QEMU process serving a sandbox: the one whose directory holds its meta.json. */
export async function qemuOf(home: string, id: string): Promise<number | undefined> {
  for (const pid of await qemuPids(home)) {
    const cmd = (await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '')).split('\0');
    const pidfile = cmd[cmd.indexOf('-pidfile') + 1];
    if (!pidfile) continue;
    const meta = await readFile(join(pidfile, '..', 'meta.json'), 'utf8').catch(() => '');
    if (meta.includes(`"${id}"`)) return pid;
  }
  return undefined;
}

/**
 * Proportional set size: shared pages (a template's RAM file) split among the processes mapping
 * them, but for the node's holder (ramhold.c), which maps every template's whole RAM file to keep
 * it cached: counted as a sharer it would lower each VM's figure by its share, so each page of a
 * template's file a VM maps is split among the others only, as before there was a holder.
 */
export async function pss(pid: number): Promise<number> {
  const t = await readFile(`/proc/${pid}/smaps_rollup`, 'utf8').catch(() => '');
  const m = /^Pss:\s+(\d+) kB/m.exec(t);
  if (!m) return Number.NaN;
  return Number(m[1]) * 1024 + (await holderShare(pid));
}

/** What the template holder's share of `pid`'s template pages is: Σ page × (1/(n−1) − 1/n) over the file pages it maps, n their mappers. */
async function holderShare(pid: number): Promise<number> {
  const maps = await readFile(`/proc/${pid}/maps`, 'utf8').catch(() => '');
  const ranges = maps
    .split('\n')
    .filter((l) => /\/(microvm|fullvm)\/templates\/[^/]+\/mem$/.test(l))
    .map((l) => l.split(' ')[0]?.split('-').map((h) => Number.parseInt(h, 16)) as [number, number]);
  if (ranges.length === 0) return 0;
  const PAGE = 4096;
  // Synchronous: a page's count is one 8-byte read, and a VM maps up to its RAM's worth of them.
  const pagemap = openSync(`/proc/${pid}/pagemap`, 'r');
  const counts = openSync('/proc/kpagecount', 'r');
  let share = 0;
  try {
    const one = Buffer.alloc(8);
    for (const [start, end] of ranges) {
      const entries = Buffer.alloc(((end - start) / PAGE) * 8);
      readSync(pagemap, entries, 0, entries.length, (start / PAGE) * 8);
      for (let i = 0; i < entries.length; i += 8) {
        const e = entries.readBigUInt64LE(i);
        // Present (bit 63) and a file page (bit 61): not yet copied by this VM, so its template's.
        if (!(e >> 63n) || !((e >> 61n) & 1n)) continue;
        readSync(counts, one, 0, 8, Number(e & ((1n << 55n) - 1n)) * 8);
        const n = Number(one.readBigUInt64LE(0));
        if (n >= 2) share += PAGE * (1 / (n - 1) - 1 / n);
      }
    }
  } finally {
    closeSync(pagemap);
    closeSync(counts);
  }
  return share;
}

/** User + system CPU of a process, in clock ticks (100 a second). */
export async function cpuTicks(pid: number): Promise<number> {
  const s = await readFile(`/proc/${pid}/stat`, 'utf8');
  const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
  return Number(f[11]) + Number(f[12]);
}

/** Bytes of the hibernation state files of a backend's VMs under a benchmark's home (the one hibernated VM's). */
export async function hibernatedBytes(home: string, kind: 'microvm' | 'fullvm'): Promise<number> {
  let bytes = Number.NaN;
  for (const d of await readdir(join(home, 'nodes'))) {
    const vms = join(home, 'nodes', d, kind, 'vms');
    for (const v of await readdir(vms).catch(() => [] as string[])) {
      const s = await stat(join(vms, v, 'state')).catch(() => null);
      if (s) bytes = s.size;
    }
  }
  return bytes;
}

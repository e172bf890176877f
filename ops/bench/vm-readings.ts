/** Host-side readings of the QEMU processes a benchmark's node runs (microVMs, full VMs). */
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

/** Proportional set size: shared pages (a template's RAM file) split among those mapping them. */
export async function pss(pid: number): Promise<number> {
  const t = await readFile(`/proc/${pid}/smaps_rollup`, 'utf8').catch(() => '');
  const m = /^Pss:\s+(\d+) kB/m.exec(t);
  return m ? Number(m[1]) * 1024 : Number.NaN;
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

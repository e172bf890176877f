/**
 * One ava run under a watchdog, for `npm test`'s two suites. A hung test can keep ava alive far
 * past its own timeout (a test that sets `t.timeout(20 min)` for an image build holds the global
 * one off), and CI keeps only the end of the output: so when ava has printed nothing for a while,
 * this prints which test files are running and every process under each, and past the run's
 * budget it interrupts ava (which then names its pending tests) and fails the run.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('../..', import.meta.url));
const ava = join(root, 'node_modules', '.bin', 'ava');

export interface AvaRun {
  code: number;
  out: string;
  /** The run passed its budget and was interrupted. */
  overBudget: boolean;
}

const SILENCE_REPORT_MS = 5 * 60_000;
const LONG_FILE_MS = 10 * 60_000;
/**
 * A test file that has finished no test for this long is taken for hung, and its worker is
 * killed: ava then counts the file failed, and `npm test` runs it again on its own. Without this
 * a hung file held the run until its budget (ava's own timeout waits while another file's test
 * has a long `t.timeout`, as the full VMs' image build has), and the run failed with no retry.
 * Every test here finishes in minutes; the slowest, a first desktop image build, in under 15.
 */
const HUNG_FILE_MS = Number(process.env.PADDOCK_TEST_HUNG_MIN || 15) * 60_000;

/** Every process by pid: its parent, age in seconds and command line. */
function processTable(): Map<number, { ppid: number; age: number; args: string }> {
  const table = new Map<number, { ppid: number; age: number; args: string }>();
  const now = Date.now() / 1000;
  const boot = now - Number(readFileSync('/proc/uptime', 'utf8').split(' ')[0]);
  const hz = 100;
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const stat = readFileSync(`/proc/${d}/stat`, 'utf8');
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      const args = readFileSync(`/proc/${d}/cmdline`, 'utf8').split('\0').filter(Boolean).join(' ');
      table.set(Number(d), { ppid: Number(fields[1]), age: Math.round(now - (boot + Number(fields[19]) / hz)), args: args || `[${stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')'))}]` });
    } catch {
      // gone meanwhile
    }
  }
  return table;
}

/** What is running now: each test file a worker has, and the process tree under it. */
function status(marks: string): string {
  const table = processTable();
  const lines: string[] = [];
  const tree = (pid: number, depth: number) => {
    const p = table.get(pid);
    if (!p || depth > 8) return;
    lines.push(`${'  '.repeat(depth + 1)}${pid} ${p.age}s ${p.args.slice(0, 240)}`);
    for (const [c, q] of table) if (q.ppid === pid) tree(c, depth + 1);
  };
  for (const m of readdirSync(marks)) {
    const file = readFileSync(join(marks, m), 'utf8');
    const since = Math.round((Date.now() - statSync(join(marks, m)).mtimeMs) / 1000);
    lines.push(`  ${file.replace(root, '')} (worker ${m}, for ${since} s):`);
    tree(Number(m), 0);
  }
  return lines.length > 0 ? lines.join('\n') : '  no test file is running';
}

/**
 * Ends a hung worker and what it started: SIGTERM first to the processes under it (a node then
 * removes its sandboxes, a nats-server its locks), SIGKILL to all that is left 15 s later.
 */
function endTree(pid: number): void {
  const table = processTable();
  const under: number[] = [];
  const walk = (p: number) => {
    for (const [c, q] of table) {
      if (q.ppid !== p) continue;
      under.push(c);
      walk(c);
    }
  };
  walk(pid);
  const send = (p: number, sig: NodeJS.Signals) => {
    try {
      process.kill(p, sig);
    } catch {}
  };
  for (const p of under) send(p, 'SIGTERM');
  setTimeout(() => {
    for (const p of [...under, pid]) send(p, 'SIGKILL');
  }, 15_000).unref();
}

export function runAva(args: string[], o: { env?: Record<string, string>; budgetMs: number; label: string }): Promise<AvaRun> {
  const marks = mkdtempSync(join(tmpdir(), 'paddock-ava-marks-'));
  const started = Date.now();
  let last = Date.now();
  let overBudget = false;
  return new Promise((resolve) => {
    // A process group of its own: past the budget, ava and every worker go at once.
    const p = spawn(ava, args, { cwd: root, stdio: ['ignore', 'pipe', 'pipe'], detached: true, env: { ...process.env, ...o.env, PADDOCK_TEST_MARKS: marks } });
    let out = '';
    /** When each file (by ava's name for it, `name ›`) last finished a test. */
    const finished = new Map<string, number>();
    const take = (write: (d: Buffer) => void) => (d: Buffer) => {
      write(d);
      const s = d.toString();
      out += s;
      last = Date.now();
      for (const m of s.matchAll(/(?:✔|✘ \[fail\]:) ([^\s›]+) ›/g)) finished.set(m[1] as string, last);
    };
    p.stdout.on('data', take((d) => process.stdout.write(d)));
    p.stderr.on('data', take((d) => process.stderr.write(d)));
    const say = (s: string) => process.stdout.write(`\npaddock: ${o.label}: ${s}\n`);
    let reported = Date.now();
    const long = new Set<string>();
    const killed = new Set<string>();
    // When each file was first and last seen running: the slowest are printed at the end, so a
    // run's time can be told apart by file.
    const spans = new Map<string, { first: number; last: number }>();
    const watch = setInterval(() => {
      const now = Date.now();
      for (const m of readdirSync(marks)) {
        try {
          const f = readFileSync(join(marks, m), 'utf8').replace(root, '');
          const s = spans.get(f);
          if (s) s.last = now;
          else spans.set(f, { first: now, last: now });
        } catch {}
      }
      if (now - started > o.budgetMs && !overBudget) {
        overBudget = true;
        say(`past its budget of ${o.budgetMs / 60_000} min; interrupting ava. Running now:\n${status(marks)}`);
        try {
          process.kill(-(p.pid as number), 'SIGINT');
        } catch {}
        setTimeout(() => {
          try {
            process.kill(-(p.pid as number), 'SIGKILL');
          } catch {}
        }, 60_000).unref();
      } else if (now - last > SILENCE_REPORT_MS && now - reported > SILENCE_REPORT_MS) {
        reported = now;
        say(`no output for ${Math.round((now - last) / 60_000)} min (${Math.round((now - started) / 60_000)} min in). Running now:\n${status(marks)}`);
      }
      for (const m of readdirSync(marks)) {
        if (killed.has(m)) continue;
        try {
          const f = readFileSync(join(marks, m), 'utf8').replace(root, '');
          const name = f.replace(/^test\//, '').replace(/\.test\.ts$/, '');
          const since = Math.max(statSync(join(marks, m)).mtimeMs, finished.get(name) ?? 0);
          if (now - since < HUNG_FILE_MS) continue;
          killed.add(m);
          say(`${f} has finished no test for ${Math.round((now - since) / 60_000)} min: taken for hung, its worker is killed (the file counts as failed and is run again on its own). Running now:\n${status(marks)}`);
          endTree(Number(m));
        } catch {}
      }
      if (!overBudget && !(now - last > SILENCE_REPORT_MS && now - reported > SILENCE_REPORT_MS)) {
        const slow = readdirSync(marks).filter((m) => !long.has(m) && now - statSync(join(marks, m)).mtimeMs > LONG_FILE_MS);
        if (slow.length > 0) {
          for (const m of slow) long.add(m);
          say(`a test file has run for over ${LONG_FILE_MS / 60_000} min. Running now:\n${status(marks)}`);
        }
      }
    }, 2000);
    p.on('exit', (c) => {
      clearInterval(watch);
      const slow = [...spans].map(([f, s]) => [f, s.last - s.first] as const).sort((a, b) => b[1] - a[1]).slice(0, 8);
      if (slow.length > 0) say(`${Math.round((Date.now() - started) / 1000)} s in all; the longest files: ${slow.map(([f, ms]) => `${f} ${Math.round(ms / 1000)} s`).join(', ')}`);
      rmSync(marks, { recursive: true, force: true });
      resolve({ code: overBudget ? 1 : (c ?? 1), out, overBudget });
    });
  });
}

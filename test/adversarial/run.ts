/**
 * `npm run test:adversarial`: runs the adversarial suite with ava, one file at a time so that no
 * file's attacks land in another's quiet measurement, then prints one row per case —
 * the verdict, whether the node still served, and the neighbour's exec p50 quiet and during the
 * attack. Exits with ava's status.
 */
import { spawn } from 'node:child_process';
import { readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { NEIGHBOUR_RATIO_MAX, type Row } from './report.ts';

const report = join(tmpdir(), `paddock-adversarial-${process.pid}.jsonl`);
const root = fileURLToPath(new URL('../..', import.meta.url));
const ava = join(root, 'node_modules', '.bin', 'ava');

const code = await new Promise<number>((resolve) => {
  const p = spawn(ava, process.argv.slice(2), { cwd: root, stdio: 'inherit', env: { ...process.env, PADDOCK_TEST_SET: 'adversarial', PADDOCK_ADV_REPORT: report } });
  p.on('exit', (c) => resolve(c ?? 1));
});

const rows = (await readFile(report, 'utf8').catch(() => ''))
  .split('\n')
  .filter(Boolean)
  .map((l) => JSON.parse(l) as Row);
await rm(report, { force: true });

const header = ['case', 'verdict', 'expected', 'node', 'neighbour p50 quiet', 'during', 'ratio'];
const body = rows.map((r) => {
  const ratio = r.duringMs / Math.max(r.quietMs, 1);
  return [r.case, r.verdict, r.expected, r.nodeServes ? 'serves' : 'DOWN', `${r.quietMs.toFixed(1)} ms`, `${r.duringMs.toFixed(1)} ms`, `${ratio.toFixed(2)}×${ratio > NEIGHBOUR_RATIO_MAX ? ' !' : ''}`];
});
const widths = header.map((h, i) => Math.max(h.length, ...body.map((b) => (b[i] as string).length)));
const line = (cells: string[]) => `| ${cells.map((c, i) => c.padEnd(widths[i] as number)).join(' | ')} |`;
const out = [line(header), `|${widths.map((w) => '-'.repeat(w + 2)).join('|')}|`, ...body.map(line)];
const contained = rows.filter((r) => r.verdict === r.expected && r.nodeServes && r.duringMs <= NEIGHBOUR_RATIO_MAX * Math.max(r.quietMs, 1)).length;
process.stdout.write(`\n${out.join('\n')}\n\n${contained}/${rows.length} cases contained with the expected verdict, the node serving and the neighbour's p50 within ${NEIGHBOUR_RATIO_MAX}×\n`);
process.exit(code);

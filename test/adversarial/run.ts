/**
 * `npm run test:adversarial`: runs the adversarial suite with ava, one file at a time so that no
 * file's attacks land in another's quiet measurement, then prints one row per case —
 * the verdict, whether the node still served, and the neighbour's exec p50 quiet and during the
 * attack. Exits with ava's status.
 */
import { readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { runAva } from '../helpers/ava-run.ts';
import { NEIGHBOUR_RATIO_MAX, type Row } from './report.ts';

const report = join(tmpdir(), `paddock-adversarial-${process.pid}.jsonl`);
// Inside npm test's 25 minutes for this suite: a quiet two-core machine runs it in about 8.
const { code } = await runAva(process.argv.slice(2), { env: { PADDOCK_TEST_SET: 'adversarial', PADDOCK_ADV_REPORT: report }, budgetMs: 22 * 60_000, label: 'the adversarial run' });

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

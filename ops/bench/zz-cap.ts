import { readdir, stat } from 'node:fs/promises';
import { execSync } from 'node:child_process';
import { join } from 'node:path';
import { startBenchNode, finishRun } from './harness.ts';
const { cluster, pdk, home } = await startBenchNode({ prefix: 'exp', env: { PADDOCK_BACKENDS: 'container,microvm' } });
let ok = false;
const fc = () => { try { return execSync(`fincore ${home}/nodes/*/microvm/templates/*/mem`, { encoding: 'utf8' }); } catch (e) { return String(e); } };
try {
  const big = await pdk.sandboxes.create({ backend: 'microvm', memoryMiB: 512, diskMiB: 128 });
  console.log(fc());
  const w = await big.exec(['sh', '-c', process.env.W ?? 'head -c 67108864 /dev/zero | tr "\\0" x > /tmp/blob; sleep 100000 >/dev/null 2>&1 & echo $! > /tmp/warm'], { timeoutMs: 120_000 });
  console.log('warm', w.exitCode, w.stdout.trim());
  console.log(fc());
  await new Promise((r) => setTimeout(r, Number(process.env.WAIT ?? 0)));
  for (let i = 0; i < 3; i++) {
    let t0 = performance.now();
    await big.hibernate();
    console.log('hibernate ms', Math.round(performance.now() - t0));
    t0 = performance.now();
    await big.restore(); await big.exec(['true']);
    console.log('restore ms', Math.round(performance.now() - t0));
  }
  await big.kill();
  ok = true;
} finally { await finishRun(ok, cluster.nodes); process.exit(0); }

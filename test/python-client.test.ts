import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { clusterTest } from './helpers/cluster.ts';
import { startTestGateway } from './helpers/gateway.ts';

const test = clusterTest();
const clientDir = fileURLToPath(new URL('../clients/python/', import.meta.url));

test("the Python client's tests pass with Debian's python3 against a live Paddock", async (t) => {
  const gw = await startTestGateway(t.context.pdk);
  t.teardown(() => gw.close());
  // Debian's own interpreter, with nothing installed: the client must need the standard library only.
  const py = spawn('/usr/bin/python3', ['-I', '-m', 'unittest', 'discover', '-v', '-s', 'tests', '-t', '.'], {
    cwd: clientDir,
    env: { PATH: '/usr/bin:/bin', PADDOCK_URL: gw.url },
  });
  let out = '';
  py.stdout.on('data', (d) => (out += d));
  py.stderr.on('data', (d) => (out += d));
  // A client that hangs must fail this test with what it printed, not hold the suite up.
  const guard = setTimeout(() => {
    out += '\n(the Python tests were still running after 5 minutes: killed)\n';
    py.kill('SIGKILL');
  }, 300_000);
  const code = await new Promise<number | null>((r) => py.on('exit', r));
  clearTimeout(guard);
  t.log(out.trim().split('\n').slice(-15).join('\n'));
  t.is(code, 0, out);
  t.regex(out, /Ran \d+ tests/);
});

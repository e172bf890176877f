import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { clusterTest } from './helpers/cluster.ts';
import { startTestGateway } from './helpers/gateway.ts';

const test = clusterTest();

/** `name{labels} value` lines of a Prometheus text page, as a map from series to value. */
function series(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    const m = /^([a-zA-Z_:][\w:]*(?:\{[^}]*\})?) (\S+)$/.exec(line);
    if (m?.[1] && m[2]) out.set(m[1], Number(m[2]));
  }
  return out;
}

test('the node and the gateway serve Prometheus metrics named by the conventions', async (t) => {
  const { pdk, cluster, home } = t.context;
  const node = cluster.nodes[0];
  if (!node) throw new Error('no node');
  const url = (await readFile(join(home, 'nodes', node.id, 'metrics.url'), 'utf8')).trim();
  const gw = await startTestGateway(pdk);
  t.teardown(() => gw.close());

  const sb = await pdk.sandboxes.create({ ttlSec: 600, labels: { job: 'metrics' }, autoResume: false });
  t.teardown(() => sb.kill());
  await sb.exec(['true']);
  await sb.exec(['true']);
  await sb.files.write('/tmp/m', 'x');
  await t.throwsAsync(sb.files.read('/tmp/missing'));
  await sb.pause();
  await fetch(`${gw.url}/v1/sandboxes/${sb.id}/exec`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ cmd: 'true' }) });

  const page = await (await fetch(url)).text();
  const s = series(page);
  t.is(s.get('paddock_creates_total{code="OK"}'), 1);
  t.true((s.get('paddock_execs_total{code="OK"}') ?? 0) >= 2);
  t.is(s.get('paddock_file_calls_total{op="files.write",code="OK"}'), 1);
  t.is(s.get('paddock_file_calls_total{op="files.read",code="NOT_FOUND"}'), 1);
  t.is(s.get('paddock_errors_total{op="files.read",code="NOT_FOUND"}'), 1);
  t.is(s.get('paddock_create_duration_seconds_count'), 1);
  t.is(s.get('paddock_placement_duration_seconds_count'), 1);
  t.true((s.get('paddock_exec_duration_seconds_count') ?? 0) >= 2);
  t.is(s.get('paddock_sandboxes{state="paused",backend="container"}'), 1);
  t.true((s.get('paddock_node_cpu_capacity_cores{backend="container"}') ?? 0) > 0);
  t.true((s.get('paddock_node_memory_capacity_bytes{backend="container"}') ?? 0) > 0);
  t.true(s.has('paddock_fn_queue_depth'));
  t.true(s.has('paddock_node_process_resident_memory_bytes'));
  // No sandbox id is a label value (ids are unbounded: one series each would grow without end).
  t.false(page.includes(sb.id));
  // Counters end in _total; durations are histograms in seconds.
  for (const m of page.matchAll(/^# TYPE (\S+) (\w+)$/gm)) {
    if (m[2] === 'counter') t.regex(m[1] ?? '', /_total$/);
    if (m[2] === 'histogram') t.regex(m[1] ?? '', /_seconds$/);
    t.regex(m[1] ?? '', /^paddock_/);
  }

  const gwPage = await (await fetch(`${gw.url}/metrics`)).text();
  const g = series(gwPage);
  t.is(g.get('paddock_gateway_http_requests_total{method="POST",route="/v1/sandboxes/:id/exec",status="409"}'), 1);
  t.is(g.get('paddock_gateway_errors_total{code="INVALID_STATE"}'), 1);
  t.true((g.get('paddock_gateway_http_request_duration_seconds_count{method="POST",route="/v1/sandboxes/:id/exec"}') ?? 0) >= 1);
  t.false(gwPage.includes(sb.id));
});

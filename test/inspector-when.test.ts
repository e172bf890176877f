/**
 * The transition inspector is attached only where what it makes is read: spans exported
 * (PADDOCK_TRACES, or a provider the embedding program registered) or a log at debug. The node's
 * own provider, which feeds its metrics, does not count. Each case runs in a process of its own:
 * a registered tracer provider is global to a process.
 */
import { execFileSync } from 'node:child_process';
import test from 'ava';

const root = new URL('..', import.meta.url).pathname;

function inspected(script: string, env: NodeJS.ProcessEnv = {}): boolean {
  const code = `
    import pino from 'pino';
    import { inspectorFor, setupTelemetry } from './ops/telemetry.ts';
    import { SimpleSpanProcessor, InMemorySpanExporter } from '@opentelemetry/sdk-trace-base';
    import { NodeTracerProvider } from '@opentelemetry/sdk-trace-node';
    const log = pino({ level: process.env.LEVEL ?? 'info' }, { write() {} });
    ${script}
    process.stdout.write(String(inspectorFor(log) !== undefined));`;
  const env2 = { ...process.env, ...env };
  delete env2.PADDOCK_TRACES;
  if (env.PADDOCK_TRACES) env2.PADDOCK_TRACES = env.PADDOCK_TRACES;
  return execFileSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', code], { cwd: root, env: env2, encoding: 'utf8' }) === 'true';
}

test('no inspector for a node that exports nothing and logs at info, metrics or not', (t) => {
  t.false(inspected(''));
  t.false(inspected("setupTelemetry('t', { processors: [new SimpleSpanProcessor(new InMemorySpanExporter())] });"));
});

test('an inspector when spans are exported, a provider is registered, or the log is at debug', (t) => {
  t.true(inspected("setupTelemetry('t', { tracesFile: '/dev/null' });", { PADDOCK_TRACES: 'file' }));
  t.true(inspected('new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(new InMemorySpanExporter())] }).register();'));
  t.true(inspected('', { LEVEL: 'debug' }));
});

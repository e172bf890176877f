/**
 * Ports inside a sandbox that has no network, reached from outside (actors/port-sessions.ts,
 * runtime/container/portfwd.c): over NATS as a Duplex, and through a listener on the node's
 * loopback; real servers (busybox httpd and nc) in a real container.
 */
import { randomBytes } from 'node:crypto';
import { request } from 'node:http';
import type { Duplex } from 'node:stream';
import type { Sandbox } from '../sdk/index.ts';
import { PORT_WINDOW_BYTES } from '../sdk/ports.ts';
import { clusterTest } from './helpers/cluster.ts';
import { eventually } from './helpers/wait.ts';

const test = clusterTest();

let sb: Sandbox;
const BIG = 64 * 1024 * 1024;
let ready: Promise<void> | undefined;

/** The sandbox and its two servers, made once (the cluster exists by the time a test runs). */
test.beforeEach((t) => {
  ready ??= (async () => {
    sb = await t.context.pdk.sandboxes.create({ labels: { t: 'ports' } });
    // 8080: HTTP; 9000: echo; 9001: 64 MiB of zeros to each connection, then the time it finished writing.
    await sb.files.write('/big.sh', `#!/bin/sh\nhead -c ${BIG} /dev/zero\ndate > /tmp/wrote\n`);
    const r = await sb.exec(['sh', '-c', 'mkdir -p /www && echo hello from inside > /www/index.html && httpd -p 127.0.0.1:8080 -h /www && (nc -ll -p 9000 -e /bin/cat </dev/null >/dev/null 2>&1 &) && chmod +x /big.sh && (nc -ll -p 9001 -e /big.sh </dev/null >/dev/null 2>&1 &) && echo started']);
    if (r.stdout !== 'started\n') throw new Error(`servers: ${r.stderr}`);
    // Servers start in the background: wait until all listen.
    await eventually(async () => {
      const out = (await sb.exec(['netstat', '-ltn'])).stdout;
      return out.includes(':9000') && out.includes(':8080') && out.includes(':9001');
    });
  })();
  return ready;
});

function readAll(s: Duplex): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const parts: Buffer[] = [];
    s.on('data', (d: Buffer) => parts.push(d));
    s.once('end', () => resolve(Buffer.concat(parts)));
    s.once('error', reject);
  });
}

test.serial('the sandbox has no network, and a server inside is still reached: HTTP over the node loopback URL', async (t) => {
  const links = (await sb.exec(['sh', '-c', 'ls /sys/class/net'])).stdout.trim();
  t.is(links, 'lo', 'only loopback inside');
  const url = await sb.ports.url(8080);
  t.regex(url, /^http:\/\/127\.0\.0\.1:\d+\/$/);
  t.is(await sb.ports.url(8080), url, 'one listener per port');
  const res = await fetch(`${url}index.html`);
  t.is(res.status, 200);
  t.is(await res.text(), 'hello from inside\n');
});

test.serial('HTTP over a NATS byte stream: http.request with the connection as its socket', async (t) => {
  const body = await new Promise<string>((resolve, reject) => {
    // Node's http calls back with a socket made asynchronously: any Duplex does.
    const createConnection = (_o: unknown, done: (err: Error | null, s?: Duplex) => void) => {
      sb.ports.connect(8080).then((s) => done(null, s), done);
      return undefined;
    };
    const req = request({ host: 'sandbox', path: '/index.html', createConnection: createConnection as never }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => {
        text += d;
      });
      res.on('end', () => resolve(text));
    });
    req.on('error', reject);
    req.end();
  });
  t.is(body, 'hello from inside\n');
});

test.serial('raw bytes both ways: 3 MiB through an echo server come back intact; end() half-closes', async (t) => {
  const conn = await sb.ports.connect(9000);
  const data = randomBytes(3 * 1024 * 1024);
  const back = readAll(conn);
  conn.write(data.subarray(0, 1000));
  conn.end(data.subarray(1000));
  const got = await back;
  t.is(got.length, data.length);
  t.true(got.equals(data));
});

test.serial('a reader that waits holds the server back: at most a window waits for it, and every byte arrives once it reads', async (t) => {
  const conn = await sb.ports.connect(9001);
  t.teardown(() => conn.destroy());
  await sb.exec(['rm', '-f', '/tmp/wrote']);
  // Not read for 3 s: the server could write all 64 MiB meanwhile, were it not held.
  await new Promise((r) => setTimeout(r, 3000));
  t.true(conn.readableLength <= 2 * PORT_WINDOW_BYTES, `${conn.readableLength} bytes wait in the stream`);
  t.is((await sb.exec(['cat', '/tmp/wrote'])).exitCode, 1, 'the server has not finished writing');
  const all = await readAll(conn);
  t.is(all.length, BIG);
  t.true(all.every((b) => b === 0));
  await eventually(async () => (await sb.exec(['cat', '/tmp/wrote'])).exitCode === 0);
});

test.serial('errors: nothing listening is NOT_FOUND (over NATS and for a URL), a bad port INVALID_REQUEST', async (t) => {
  await t.throwsAsync(sb.ports.connect(9999), { code: 'NOT_FOUND', message: /nothing listens on port 9999/ } as never);
  await t.throwsAsync(sb.ports.url(9999), { code: 'NOT_FOUND' } as never);
  await t.throwsAsync(sb.ports.connect(0), { code: 'INVALID_REQUEST' } as never);
  await t.throwsAsync(sb.ports.url(70_000), { code: 'INVALID_REQUEST' } as never);
  await t.throwsAsync(sb.call('ports.send', { connId: 'p-none', d: new Uint8Array(1) }), { code: 'NOT_FOUND' } as never);
  t.deepEqual(await sb.call('ports.close', { connId: 'p-none' }), { closed: false });
});

test.serial('connections and listeners end with the sandbox', async (t) => {
  const conn = await sb.ports.connect(9000);
  const closed = new Promise<void>((resolve) => conn.once('close', () => resolve()));
  conn.on('error', () => {});
  conn.resume();
  const url = await sb.ports.url(8080);
  await sb.kill();
  await closed;
  t.pass('the open connection ended');
  await t.throwsAsync(fetch(url), undefined, 'the loopback listener is closed');
});

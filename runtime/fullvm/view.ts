/**
 * The live view of full VMs for a person: each VM's display is QEMU's VNC server on a unix socket
 * in the VM's directory, and the node serves it on loopback as a WebSocket (RFB over binary
 * frames, what noVNC speaks) plus a page with noVNC on it. A view URL carries a random token of
 * its own; it is read-only unless control was asked for: the proxy reads the viewer's RFB
 * messages and drops key, pointer and clipboard events (a message it does not know ends the
 * connection), so a read-only viewer cannot type into the VM even with a client of its own.
 * Tokens end with their sandbox.
 */
import { randomBytes } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createRequire } from 'node:module';
import { connect, type Socket } from 'node:net';
import { dirname, extname, join, normalize, sep } from 'node:path';
import { type WebSocket, WebSocketServer } from 'ws';
import { ROOT } from '../source.ts';

interface View {
  id: string;
  control: boolean;
  socket: string;
  conns: Set<WebSocket>;
}

const TYPES: Record<string, string> = { '.js': 'text/javascript; charset=utf-8', '.html': 'text/html; charset=utf-8', '.css': 'text/css', '.svg': 'image/svg+xml', '.png': 'image/png' };

/** noVNC's package directory (it exports only core/rfb.js, not its package.json). */
function novncDir(): string {
  return dirname(dirname(createRequire(join(ROOT, 'package.json')).resolve('@novnc/novnc')));
}

function page(token: string, control: boolean): string {
  return `<!doctype html><meta charset="utf-8"><title>Paddock: live view</title><link rel="icon" href="data:,">
<style>html,body{margin:0;height:100%;background:#222}#screen{width:100%;height:100%}#bar{position:fixed;top:0;right:0;padding:2px 8px;font:12px sans-serif;color:#ddd;background:#0008}</style>
<div id="bar">${control ? 'control' : 'view only'} · <span id="st">connecting</span></div><div id="screen"></div>
<script type="module">
import RFB from '/novnc/core/rfb.js';
const rfb = new RFB(document.getElementById('screen'), (location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + '/v/${token}/ws', { shared: true });
rfb.viewOnly = ${!control};
rfb.scaleViewport = true;
const st = document.getElementById('st');
rfb.addEventListener('connect', () => (st.textContent = 'live'));
rfb.addEventListener('disconnect', () => (st.textContent = 'ended'));
</script>`;
}

/**
 * An RFB client-to-server message at the start of `b`: its full length (undefined: not all there
 * yet) and whether a read-only viewer's copy goes on. Unknown types: null, the connection ends.
 */
function clientMessage(b: Buffer): { len: number | undefined; pass: boolean } | null {
  const need = (n: number, len: () => number) => (b.length < n ? undefined : len());
  switch (b[0]) {
    case 0: // SetPixelFormat
      return { len: 20, pass: true };
    case 2: // SetEncodings
      return { len: need(4, () => 4 + 4 * b.readUInt16BE(2)), pass: true };
    case 3: // FramebufferUpdateRequest
      return { len: 10, pass: true };
    case 150: // EnableContinuousUpdates
      return { len: 10, pass: true };
    case 248: // ClientFence
      return { len: need(9, () => 9 + b[8]!), pass: true };
    case 4: // KeyEvent
      return { len: 8, pass: false };
    case 5: // PointerEvent
      return { len: 6, pass: false };
    case 6: // ClientCutText
      return { len: need(8, () => 8 + b.readUInt32BE(4)), pass: false };
    case 255: // QEMU's messages: extended key events (0) only; its audio (1) is not for a view
      return b.length < 2 ? { len: undefined, pass: false } : b[1] === 0 ? { len: 12, pass: false } : null;
    default:
      return null;
  }
}

/** Passes a read-only viewer's handshake and harmless requests on; input ends the connection. */
class ReadOnlyFilter {
  private buf = Buffer.alloc(0);
  /** Version (12 bytes), the chosen security type (1), ClientInit (1). */
  private handshake = 14;

  /** What may go to the VNC server; null when the viewer sent something a view must not. */
  take(chunk: Buffer): Buffer | null {
    this.buf = Buffer.concat([this.buf, chunk]);
    const out: Buffer[] = [];
    if (this.handshake > 0) {
      const n = Math.min(this.handshake, this.buf.length);
      out.push(this.buf.subarray(0, n));
      this.buf = this.buf.subarray(n);
      this.handshake -= n;
    }
    while (this.handshake === 0 && this.buf.length > 0) {
      const m = clientMessage(this.buf);
      if (!m) return null;
      if (m.len === undefined || this.buf.length < m.len) break;
      // Input from a viewer without control is dropped, not refused: a person pressing a key in a view page stays connected.
      if (m.pass) out.push(this.buf.subarray(0, m.len));
      this.buf = this.buf.subarray(m.len);
    }
    return Buffer.concat(out);
  }
}

export class ViewServer {
  private server?: Server;
  private wss?: WebSocketServer;
  private base?: Promise<string>;
  private readonly views = new Map<string, View>();

  constructor(private readonly listen: { host: string; port: number } = { host: '127.0.0.1', port: 0 }) {}

  /** A URL that shows sandbox `id`'s screen (the VNC server at `socket`); `control` lets the viewer type and click. */
  async url(id: string, socket: string, control: boolean): Promise<string> {
    const base = await this.start();
    const token = randomBytes(18).toString('base64url');
    this.views.set(token, { id, control, socket, conns: new Set() });
    return `${base}/v/${token}`;
  }

  /** Ends every view of `id` (its sandbox is gone or asleep). */
  revoke(id: string): void {
    for (const [token, v] of this.views) {
      if (v.id !== id) continue;
      for (const c of v.conns) c.terminate();
      this.views.delete(token);
    }
  }

  private start(): Promise<string> {
    this.base ??= new Promise<string>((resolve, reject) => {
      // A bad request must not take the node down with it.
      const server = createServer((req, res) =>
        this.http(req, res).catch(() => {
          if (!res.headersSent) res.writeHead(500);
          res.end();
        }),
      );
      const wss = new WebSocketServer({ noServer: true, handleProtocols: (p) => (p.has('binary') ? 'binary' : false) });
      server.on('upgrade', (req, sock, head) => {
        const view = this.viewOf(req.url, '/ws');
        if (!view) {
          sock.end('HTTP/1.1 404 Not Found\r\nconnection: close\r\n\r\n');
          return;
        }
        wss.handleUpgrade(req, sock, head, (ws) => this.proxy(ws, view));
      });
      server.once('error', reject);
      server.listen(this.listen.port, this.listen.host, () => {
        const a = server.address();
        if (!a || typeof a === 'string') return reject(new Error('view server: no address'));
        resolve(`http://${this.listen.host}:${a.port}`);
      });
      this.server = server;
      this.wss = wss;
    });
    return this.base;
  }

  private viewOf(url: string | undefined, suffix: string): View | undefined {
    const m = /^\/v\/([A-Za-z0-9_-]+)(\/ws)?$/.exec((url ?? '').split('?')[0]!);
    if (!m || (m[2] ?? '') !== suffix) return undefined;
    return this.views.get(m[1]!);
  }

  private async http(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = (req.url ?? '/').split('?')[0]!;
    if (path.startsWith('/novnc/')) {
      const dir = novncDir();
      const file = normalize(join(dir, path.slice('/novnc/'.length)));
      if (!file.startsWith(dir + sep) || !TYPES[extname(file)]) return void res.writeHead(404).end();
      const body = await readFile(file).catch(() => null);
      if (!body) return void res.writeHead(404).end();
      res.writeHead(200, { 'content-type': TYPES[extname(file)]!, 'cache-control': 'max-age=3600' }).end(body);
      return;
    }
    const token = /^\/v\/([A-Za-z0-9_-]+)$/.exec(path)?.[1];
    const view = token ? this.views.get(token) : undefined;
    if (!token || !view) return void res.writeHead(404, { 'content-type': 'text/plain' }).end('no such view (it ended with its sandbox, or never was)\n');
    res.writeHead(200, { 'content-type': TYPES['.html']!, 'cache-control': 'no-store' }).end(page(token, view.control));
  }

  private proxy(ws: WebSocket, view: View): void {
    view.conns.add(ws);
    const vnc: Socket = connect(view.socket);
    const filter = view.control ? undefined : new ReadOnlyFilter();
    const end = () => {
      view.conns.delete(ws);
      vnc.destroy();
      if (ws.readyState === ws.OPEN || ws.readyState === ws.CONNECTING) ws.close();
    };
    vnc.on('data', (d) => ws.send(d, { binary: true }));
    vnc.on('error', end);
    vnc.on('close', end);
    ws.on('message', (data: Buffer) => {
      const pass = filter ? filter.take(data) : data;
      if (pass === null) {
        ws.close(1008, 'an RFB message a view does not pass');
        end();
        return;
      }
      if (pass.length) vnc.write(pass);
    });
    ws.on('close', end);
    ws.on('error', end);
  }

  async close(): Promise<void> {
    for (const v of this.views.values()) for (const c of v.conns) c.terminate();
    this.views.clear();
    this.wss?.close();
    await new Promise<void>((r) => (this.server ? this.server.close(() => r()) : r()));
  }
}

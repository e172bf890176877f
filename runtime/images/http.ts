/** HTTP with hard deadlines, for talking to layer stores: a store that stops answering is an error, never a hang. */
import { createWriteStream } from 'node:fs';
import { type Agent, type IncomingMessage, request } from 'node:http';
import { pipeline } from 'node:stream/promises';

export interface HttpResponse {
  status: number;
  headers: IncomingMessage['headers'];
  body: Buffer;
}

/** One HTTP request with a hard deadline: a store that does not answer is an error, never a hang. */
export function httpRequest(
  url: string,
  o: { method?: string; headers?: Record<string, string>; body?: Buffer | NodeJS.ReadableStream; timeoutMs: number; agent?: Agent; maxBytes?: number; signal?: AbortSignal },
): Promise<HttpResponse> {
  return new Promise((resolve, reject) => {
    const req = request(url, { method: o.method ?? 'GET', headers: o.headers, agent: o.agent, signal: o.signal }, (res) => {
      const parts: Buffer[] = [];
      let n = 0;
      res.on('data', (c: Buffer) => {
        n += c.length;
        if (o.maxBytes !== undefined && n > o.maxBytes) {
          req.destroy(new Error(`response from ${url} larger than ${o.maxBytes} bytes`));
          return;
        }
        parts.push(c);
      });
      res.on('end', () => {
        clearTimeout(timer);
        resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(parts) });
      });
      res.on('error', (e) => {
        clearTimeout(timer);
        reject(e);
      });
    });
    const timer = setTimeout(() => req.destroy(new Error(`no answer from ${url} within ${o.timeoutMs} ms`)), o.timeoutMs);
    req.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    if (o.body instanceof Buffer) req.end(o.body);
    else if (o.body) {
      pipeline(o.body, req).catch((e: unknown) => req.destroy(e as Error));
    } else req.end();
  });
}

/** Downloads `url` to `dest`, failing if the transfer stalls for `idleMs`. */
export function httpDownload(url: string, dest: string, o: { idleMs: number; agent?: Agent; onData?: (n: number) => void }): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = request(url, { agent: o.agent }, (res) => {
      if (res.statusCode !== 200) {
        res.resume();
        reject(new Error(`GET ${url}: HTTP ${res.statusCode}`));
        return;
      }
      let n = 0;
      res.on('data', (c: Buffer) => {
        n += c.length;
        o.onData?.(c.length);
        req.setTimeout(o.idleMs);
      });
      pipeline(res, createWriteStream(dest)).then(
        () => resolve(n),
        (e: unknown) => reject(e),
      );
    });
    req.setTimeout(o.idleMs, () => req.destroy(new Error(`download of ${url} stalled for ${o.idleMs} ms`)));
    req.on('error', reject);
    req.end();
  });
}


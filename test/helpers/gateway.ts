/** A gateway on a random loopback port in front of a test cluster, and an SSE reader for tests. */
import { loadKeys } from '../../ops/gateway/auth.ts';
import { buildGateway, type GatewayOptions } from '../../ops/gateway/server.ts';
import type { Paddock } from '../../sdk/index.ts';

export interface TestGateway {
  url: string;
  registered: Array<{ method: string; url: string }>;
  close(): Promise<void>;
}

export async function startTestGateway(pdk: Paddock, opts: Partial<GatewayOptions> = {}): Promise<TestGateway> {
  const { app, registered } = buildGateway({ pdk, keys: loadKeys({}), ...opts });
  await app.listen({ host: '127.0.0.1', port: 0 });
  const a = app.server.address();
  if (!a || typeof a !== 'object') throw new Error('the gateway did not listen');
  return {
    url: `http://127.0.0.1:${a.port}`,
    registered,
    close: async () => {
      app.server.closeAllConnections();
      await app.close();
    },
  };
}

export interface SseEvent {
  event: string;
  data: unknown;
}

/** The events of a text/event-stream body as they come. */
export async function* sseEvents(res: Response): AsyncGenerator<SseEvent> {
  if (!res.body) return;
  const dec = new TextDecoder();
  let buf = '';
  for await (const chunk of res.body) {
    buf += dec.decode(chunk as Uint8Array, { stream: true });
    for (let i = buf.indexOf('\n\n'); i >= 0; i = buf.indexOf('\n\n')) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      let event = 'message';
      const data: string[] = [];
      for (const line of block.split('\n')) {
        if (line.startsWith('event: ')) event = line.slice(7);
        else if (line.startsWith('data: ')) data.push(line.slice(6));
      }
      if (data.length > 0) yield { event, data: JSON.parse(data.join('\n')) };
    }
  }
}

/**
 * The OpenAPI 3.1 document of the gateway, made from the protocol's JSON Schema (protocol/api.ts,
 * itself generated from the TypeBox messages of protocol/schema.ts) and the route table
 * (routes.ts). Bodies that the gateway reshapes for JSON (text output instead of bytes, a string
 * command) are derived from the wire message they stand for.
 */
import { protocolJsonSchema } from '../../protocol/api.ts';
import { ErrorCodes } from '../../protocol/index.ts';
import { HttpStatus } from './errors.ts';
import { type Route, Routes } from './routes.ts';

// biome-ignore lint/suspicious/noExplicitAny: JSON Schema is untyped JSON
type Json = any;

/** `#/$defs/X` → `#/components/schemas/X`, everywhere in a schema. */
function rehome(n: Json): Json {
  if (Array.isArray(n)) return n.map(rehome);
  if (typeof n !== 'object' || n === null) return n;
  const out: Json = {};
  for (const [k, v] of Object.entries(n)) out[k] = k === '$ref' && typeof v === 'string' ? v.replace('#/$defs/', '#/components/schemas/') : rehome(v);
  return out;
}

const ref = (name: string) => ({ $ref: `#/components/schemas/${name}` });

/** The gateway's own bodies, built from the wire messages they reshape. */
function gatewaySchemas(defs: Record<string, Json>): Record<string, Json> {
  const exec = defs.ExecRequest;
  const { stream: _s, execId: _e, stdin: _i, cmd, ...execProps } = exec.properties;
  const result = defs.ExecResult;
  const exitProps = Object.fromEntries(Object.entries(result.properties).filter(([k]) => k !== 'stdout' && k !== 'stderr' && k !== 'replayed'));
  return {
    HttpError: {
      type: 'object',
      description: 'Every error answer. `code` is the stable wire code; `retryable` says whether the same call may succeed later (then `Retry-After` says when to try).',
      properties: { code: { type: 'string', enum: Object.keys(ErrorCodes) }, message: { type: 'string' }, retryable: { type: 'boolean' }, detail: { type: 'object' } },
      required: ['code', 'message', 'retryable'],
    },
    SandboxList: { type: 'object', properties: { sandboxes: { type: 'array', items: ref('SandboxInfo') } }, required: ['sandboxes'] },
    HttpExecRequest: {
      type: 'object',
      description: 'ExecRequest as JSON: `cmd` may be a string (run by /bin/sh -c), stdin is text (or base64 in `stdinBase64`).',
      properties: { cmd: { oneOf: [{ type: 'string' }, cmd] }, stdin: { type: 'string', description: 'standard input as text' }, stdinBase64: { type: 'string', contentEncoding: 'base64' }, ...execProps },
      required: ['cmd'],
    },
    HttpExecResult: {
      type: 'object',
      description: 'ExecResult with stdout and stderr as UTF-8 text.',
      properties: { ...result.properties, stdout: { type: 'string' }, stderr: { type: 'string' } },
      required: result.required,
    },
    ExecEvents: {
      description: 'text/event-stream: `event: stdout` / `event: stderr` with `{"text": …}` (or `{"data": base64}` with encoding=base64), then one `event: exit` with the fields below, or `event: error` with an HttpError.',
      type: 'object',
      properties: exitProps,
    },
    HttpProcessStart: {
      type: 'object',
      description: 'ProcessStartRequest as JSON: `cmd` may be a string (run by /bin/sh -c).',
      properties: { ...defs.ProcessStartRequest.properties, cmd: { oneOf: [{ type: 'string' }, defs.ProcessStartRequest.properties.cmd] } },
    },
    HttpProcessInput: {
      type: 'object',
      properties: { text: { type: 'string', description: 'input as text' }, data: { type: 'string', contentEncoding: 'base64', description: 'input as base64' }, eof: { type: 'boolean', description: 'close its stdin after the input' } },
    },
    HttpProcessResize: { type: 'object', properties: { cols: { type: 'integer' }, rows: { type: 'integer' } }, required: ['cols', 'rows'] },
    ProcessEvents: {
      description: 'text/event-stream: `event: stdout` / `event: stderr` with `{"text": …, "offset": n}` (or `{"data": base64, …}` with encoding=base64), `event: gap` with `{stream, offset, bytes}` for bytes dropped before they were asked for, then `event: exit` with the fields below (or `event: end` with follow=0), or `event: error` with an HttpError.',
      type: 'object',
      properties: exitProps,
    },
    SandboxEvents: { description: 'text/event-stream: `event: sandbox`, data a SandboxInfo after each transition.', ...ref('SandboxInfo') },
    HttpUploadReply: { type: 'object', properties: { path: { type: 'string' }, entries: { type: 'integer', description: 'files, directories and symlinks written' }, bytes: { type: 'integer', description: 'file bytes written' } }, required: ['path', 'entries', 'bytes'] },
    HttpWriteReply: { type: 'object', properties: { path: { type: 'string' }, size: { type: 'integer', description: 'bytes written' } }, required: ['path', 'size'] },
    HttpRolloutView: { type: 'object', properties: { rollout: ref('RolloutRecord'), sandbox: ref('SandboxInfo'), lastStep: { type: 'integer', description: 'highest step recorded (-1: none)' } }, required: ['rollout', 'sandbox', 'lastStep'] },
    NodeRecord: { type: 'object', description: 'A node heartbeat record (protocol/messages.ts NodeRecord): node, backends, images, capacity, allocated, sandboxes, state, offers, fn.', properties: { node: { type: 'string' }, state: { type: 'string', enum: ['serving', 'draining'] }, sandboxes: { type: 'integer' } }, required: ['node'] },
    HttpComputerReply: {
      type: 'object',
      description: 'ComputerReply with the screenshot, when there is one, as base64 (the shape computer-use harnesses pass to a model).',
      properties: {
        cursor: defs.ComputerReply.properties.cursor,
        screenshot: { type: 'object', properties: { png: { type: 'string', contentEncoding: 'base64' }, width: { type: 'integer' }, height: { type: 'integer' } }, required: ['png', 'width', 'height'] },
      },
      required: ['cursor'],
    },
    NodeList: { type: 'object', properties: { nodes: { type: 'array', items: ref('NodeRecord') } }, required: ['nodes'] },
    NodeInfo: { allOf: [ref('NodeRecord'), { type: 'object', properties: { ids: { type: 'array', items: { type: 'string' } }, layers: { type: 'object' } } }] },
  };
}

function content(reply: string, sse?: string): Json {
  if (reply === 'none') return undefined;
  if (reply === 'raw') return { 'application/octet-stream': { schema: { type: 'string', contentMediaType: 'application/octet-stream' } } };
  if (reply === 'png') return { 'image/png': { schema: { type: 'string', contentMediaType: 'image/png' } } };
  if (reply === 'jsonl') return { 'application/x-ndjson': { schema: { type: 'string' } } };
  if (reply === 'prometheus') return { 'text/plain': { schema: { type: 'string' } } };
  if (reply === 'sse') return { 'text/event-stream': { schema: ref(sse ?? 'SandboxEvents') } };
  const out: Json = { 'application/json': { schema: reply === 'json' ? { type: 'object' } : ref(reply) } };
  if (sse) out['text/event-stream'] = { schema: ref(sse) };
  return out;
}

function operation(r: Route): Json {
  const op: Json = { operationId: r.operationId, summary: r.summary, tags: [r.tag] };
  if (r.params?.length) op.parameters = r.params.map((p) => ({ name: p.name, in: p.in, description: p.description, required: p.required ?? false, schema: p.schema ?? { type: 'string' } }));
  if (r.request) {
    op.requestBody = { required: r.request !== 'SandboxSpec', content: r.request === 'raw' ? { 'application/octet-stream': { schema: { type: 'string', contentMediaType: 'application/octet-stream' } } } : { 'application/json': { schema: ref(r.request) } } };
  }
  const status = String(r.status ?? 200);
  const ok: Json = { description: r.summary };
  const c = content(r.reply, r.sse);
  if (c) ok.content = c;
  op.responses = { [status]: ok, default: { description: 'an error', content: { 'application/json': { schema: ref('HttpError') } } } };
  if (r.operationId === 'readFile') op.responses['206'] = { description: 'the requested range', content: content('raw') };
  if (!r.public) op.security = [{ bearer: [] }, {}];
  return op;
}

let cached: Json | undefined;

export function openApiDocument(): Json {
  if (cached) return cached;
  const proto = protocolJsonSchema();
  const schemas: Record<string, Json> = rehome(proto.$defs);
  Object.assign(schemas, rehome(gatewaySchemas(schemas)));
  const paths: Json = {};
  for (const r of Routes) {
    paths[r.path] ??= {};
    paths[r.path][r.method.toLowerCase()] = operation(r);
  }
  cached = {
    openapi: '3.1.0',
    info: {
      title: 'Paddock HTTP gateway',
      version: '1',
      description: `JSON and Server-Sent Events over the same NATS requests the SDK makes (protocol v1). Errors: HttpError with the status of its code (${Object.entries(HttpStatus)
        .map(([k, v]) => `${k} ${v}`)
        .join(', ')}); 429 and 503 carry Retry-After. No API key configured: loopback clients only.`,
    },
    jsonSchemaDialect: 'https://json-schema.org/draft/2020-12/schema',
    paths,
    components: { schemas, securitySchemes: { bearer: { type: 'http', scheme: 'bearer', description: 'a key from PADDOCK_API_KEYS or PADDOCK_API_KEYS_FILE' } } },
  };
  return cached;
}

/**
 * Every route of the gateway, once: the server registers these and the OpenAPI document is made
 * from them, with request and reply bodies named after the protocol's messages (protocol/schema.ts).
 */

export interface Param {
  name: string;
  in: 'path' | 'query' | 'header';
  description: string;
  required?: boolean;
  /** A JSON Schema type for the parameter (default string). */
  schema?: Record<string, unknown>;
}

export interface Route {
  operationId: string;
  method: 'GET' | 'POST' | 'PUT' | 'DELETE';
  /** OpenAPI style: `{id}`. */
  path: string;
  summary: string;
  tag: string;
  params?: Param[];
  /** A message of protocol/schema.ts, or one of the gateway's own bodies (GatewaySchemas in openapi.ts). */
  request?: string;
  /** Likewise; `raw` for bytes, `png` for an image, `jsonl` for JSON lines, `sse` for an event stream, `none` for 204. */
  reply: string;
  /** Status of a success (default 200). */
  status?: number;
  /** The body is bytes, read as a stream (file uploads). */
  rawBody?: boolean;
  /** Served without an API key (the dashboard's static files, health). */
  public?: boolean;
  /** Also answers `Accept: text/event-stream` with this event stream. */
  sse?: string;
}

const id: Param = { name: 'id', in: 'path', description: 'the sandbox id', required: true };
const rolloutId: Param = { name: 'rolloutId', in: 'path', description: 'the rollout id', required: true };
const pidParam: Param = { name: 'pid', in: 'path', description: 'the process id (`p1`, …)', required: true };
const filePath: Param = { name: 'path', in: 'query', description: 'an absolute path inside the sandbox', required: true };
const lifecycle = (verb: string, summary: string): Route => ({ operationId: `${verb}Sandbox`, method: 'POST', path: `/v1/sandboxes/{id}/${verb}`, summary, tag: 'sandboxes', params: [id], reply: 'SandboxInfo' });

export const Routes: Route[] = [
  { operationId: 'createSandbox', method: 'POST', path: '/v1/sandboxes', summary: 'Create a sandbox; answers once it runs', tag: 'sandboxes', request: 'SandboxSpec', reply: 'SandboxInfo', status: 201 },
  {
    operationId: 'listSandboxes',
    method: 'GET',
    path: '/v1/sandboxes',
    summary: 'Sandboxes from the directory, oldest first',
    tag: 'sandboxes',
    params: [
      { name: 'label', in: 'query', description: '`key=value`; repeat (or separate by commas) for several, all must match' },
      { name: 'group', in: 'query', description: 'only this training job' },
      { name: 'state', in: 'query', description: 'only these states, comma-separated' },
      { name: 'node', in: 'query', description: 'only sandboxes on this node' },
      { name: 'backend', in: 'query', description: 'only this backend kind' },
      { name: 'all', in: 'query', description: '`1`: include ended and sleeping sandboxes', schema: { type: 'boolean' } },
    ],
    reply: 'SandboxList',
  },
  { operationId: 'getSandbox', method: 'GET', path: '/v1/sandboxes/{id}', summary: "A sandbox's record (ended ones too, while the directory keeps them)", tag: 'sandboxes', params: [id], reply: 'SandboxInfo' },
  { operationId: 'killSandbox', method: 'DELETE', path: '/v1/sandboxes/{id}', summary: 'Kill a sandbox and wait until it is gone', tag: 'sandboxes', params: [id], reply: 'SandboxInfo' },
  {
    operationId: 'execSandbox',
    method: 'POST',
    path: '/v1/sandboxes/{id}/exec',
    summary: 'Run a command to completion (JSON), or stream its output (Accept: text/event-stream; closing the connection kills it)',
    tag: 'sandboxes',
    params: [id, { name: 'encoding', in: 'query', description: 'streams only: `base64` sends output bytes as `data` (base64) instead of `text`' }],
    request: 'HttpExecRequest',
    reply: 'HttpExecResult',
    sse: 'ExecEvents',
  },
  lifecycle('pause', 'Freeze every process; state, memory and files are kept'),
  lifecycle('resume', 'Resume a paused or hibernated sandbox'),
  lifecycle('hibernate', 'Freeze and give memory back to the node'),
  lifecycle('restore', 'Wake a hibernated sandbox'),
  { operationId: 'snapshotSandbox', method: 'POST', path: '/v1/sandboxes/{id}/snapshot', summary: "Save a sandbox (a VM's whole state on its node, a container's files in the image store; it runs on); `fromSnapshot` in a create starts copies of it", tag: 'snapshots', params: [id], reply: 'SnapshotInfo', status: 201 },
  { operationId: 'forkSandbox', method: 'POST', path: '/v1/sandboxes/{id}/fork', summary: "`count` copies of a running sandbox on its node, all or none", tag: 'snapshots', params: [id], request: 'ForkRequest', reply: 'ForkReply', status: 201 },
  { operationId: 'setNetwork', method: 'POST', path: '/v1/sandboxes/{id}/network', summary: 'Replace the egress policy', tag: 'sandboxes', params: [id], request: 'NetworkSetRequest', reply: 'NetworkSetReply' },
  { operationId: 'sandboxStats', method: 'GET', path: '/v1/sandboxes/{id}/stats', summary: 'What the sandbox uses now', tag: 'sandboxes', params: [id], reply: 'SandboxStats' },
  { operationId: 'screenshot', method: 'GET', path: '/v1/sandboxes/{id}/display/screenshot', summary: "A full VM's screen as a PNG (taken by the VMM)", tag: 'display', params: [id], reply: 'png' },
  { operationId: 'displayView', method: 'GET', path: '/v1/sandboxes/{id}/display/view', summary: 'A URL of a live view of the screen (noVNC on the node), view only unless control=1', tag: 'display', params: [id, { name: 'control', in: 'query', description: '`1`: the viewer may type and click', schema: { type: 'boolean' } }], reply: 'DisplayViewReply' },
  { operationId: 'computerAction', method: 'POST', path: '/v1/sandboxes/{id}/computer', summary: 'One action of the computer-use action set (left_click, type, key, scroll, …)', tag: 'display', params: [id], request: 'ComputerAction', reply: 'HttpComputerReply' },
  { operationId: 'startProcess', method: 'POST', path: '/v1/sandboxes/{id}/processes', summary: 'Start a background process (or a terminal, with `pty`); answers at once', tag: 'processes', params: [id], request: 'HttpProcessStart', reply: 'ProcessInfo', status: 201 },
  { operationId: 'listProcesses', method: 'GET', path: '/v1/sandboxes/{id}/processes', summary: 'The running processes and the most recent that exited', tag: 'processes', params: [id], reply: 'ProcessListReply' },
  { operationId: 'getProcess', method: 'GET', path: '/v1/sandboxes/{id}/processes/{pid}', summary: "A process's record", tag: 'processes', params: [id, pidParam], reply: 'ProcessInfo' },
  { operationId: 'waitProcess', method: 'POST', path: '/v1/sandboxes/{id}/processes/{pid}/wait', summary: 'Its record once it has exited, or after 20 s with `state: running` (ask again)', tag: 'processes', params: [id, pidParam], reply: 'ProcessInfo' },
  { operationId: 'killProcess', method: 'POST', path: '/v1/sandboxes/{id}/processes/{pid}/kill', summary: 'Send it a signal (default SIGKILL: its whole tree)', tag: 'processes', params: [id, pidParam, { name: 'signal', in: 'query', description: 'e.g. SIGTERM' }], reply: 'ProcessInfo' },
  { operationId: 'processInput', method: 'POST', path: '/v1/sandboxes/{id}/processes/{pid}/input', summary: 'Bytes for its stdin (a terminal: keys typed); `eof` closes it', tag: 'processes', params: [id, pidParam], request: 'HttpProcessInput', reply: 'Empty' },
  { operationId: 'resizeProcess', method: 'POST', path: '/v1/sandboxes/{id}/processes/{pid}/resize', summary: "A terminal's new size", tag: 'processes', params: [id, pidParam], request: 'HttpProcessResize', reply: 'Empty' },
  {
    operationId: 'processOutput',
    method: 'GET',
    path: '/v1/sandboxes/{id}/processes/{pid}/output',
    summary: 'Its output from byte offsets, as Server-Sent Events, until it exits (follow=0: what is held now)',
    tag: 'processes',
    params: [
      id,
      pidParam,
      { name: 'stdout', in: 'query', description: 'stdout offset to start from (default 0)', schema: { type: 'integer' } },
      { name: 'stderr', in: 'query', description: 'stderr offset to start from (default 0)', schema: { type: 'integer' } },
      { name: 'follow', in: 'query', description: '`0`: only what the node holds now', schema: { type: 'boolean' } },
      { name: 'hold', in: 'query', description: '`1`: every byte at this reader’s pace (containers): the process waits on its pipe while this response is a window behind, instead of the reader getting `gap`s; a reader that takes nothing for 60 s is let go (`event: error`, CANCELLED)', schema: { type: 'boolean' } },
      { name: 'encoding', in: 'query', description: '`base64` sends output bytes as `data` (base64) instead of `text`' },
    ],
    reply: 'ProcessEvents',
    sse: 'ProcessEvents',
  },
  {
    operationId: 'readFile',
    method: 'GET',
    path: '/v1/sandboxes/{id}/files',
    summary: "A file's bytes; `Range: bytes=a-b` answers 206 with that part",
    tag: 'files',
    params: [id, filePath, { name: 'Range', in: 'header', description: 'bytes=start-end, bytes=start-, or bytes=-suffix' }],
    reply: 'raw',
  },
  {
    operationId: 'writeFile',
    method: 'PUT',
    path: '/v1/sandboxes/{id}/files',
    summary: 'Replace (or create) a file with the body, of any size; parent directories are made',
    tag: 'files',
    params: [id, filePath, { name: 'mode', in: 'query', description: 'file mode (e.g. 493 for 0755)', schema: { type: 'integer' } }],
    request: 'raw',
    reply: 'HttpWriteReply',
    rawBody: true,
  },
  { operationId: 'removeFile', method: 'DELETE', path: '/v1/sandboxes/{id}/files', summary: 'Remove a file (a directory with `recursive=1`)', tag: 'files', params: [id, filePath, { name: 'recursive', in: 'query', description: '`1`: remove a directory and all in it', schema: { type: 'boolean' } }], reply: 'none', status: 204 },
  {
    operationId: 'uploadTar',
    method: 'PUT',
    path: '/v1/sandboxes/{id}/files/tar',
    summary: 'Unpack the body, a tar archive, into the existing directory `path` (files, directories and symlinks; modes and mtimes kept), streamed',
    tag: 'files',
    params: [id, { name: 'path', in: 'query', description: 'an existing directory inside the sandbox', required: true }],
    request: 'raw',
    reply: 'HttpUploadReply',
    rawBody: true,
  },
  { operationId: 'downloadTar', method: 'GET', path: '/v1/sandboxes/{id}/files/tar', summary: 'A tar archive of `path` (a directory or a file), streamed; symlinks stay symlinks', tag: 'files', params: [id, filePath], reply: 'raw' },
  { operationId: 'listFiles', method: 'GET', path: '/v1/sandboxes/{id}/files/list', summary: 'The entries of a directory', tag: 'files', params: [id, filePath], reply: 'FilesListReply' },
  {
    operationId: 'groupVerb',
    method: 'POST',
    path: '/v1/groups/{group}/{verb}',
    summary: 'pause, resume, hibernate, restore or kill every sandbox of a training job, on every node',
    tag: 'groups',
    params: [
      { name: 'group', in: 'path', description: 'the training job', required: true },
      { name: 'verb', in: 'path', description: 'pause, resume, hibernate, restore or kill', required: true, schema: { type: 'string', enum: ['pause', 'resume', 'hibernate', 'restore', 'kill'] } },
    ],
    reply: 'GroupReply',
  },
  { operationId: 'startRollout', method: 'POST', path: '/v1/rollouts', summary: 'Create a sandbox and a rollout on it (exec with `rolloutId` and `step` records steps)', tag: 'rollouts', request: 'RolloutsStartRequest', reply: 'HttpRolloutView', status: 201 },
  { operationId: 'getRollout', method: 'GET', path: '/v1/rollouts/{rolloutId}', summary: "The rollout's record", tag: 'rollouts', params: [rolloutId], reply: 'RolloutRecord' },
  { operationId: 'attachRollout', method: 'POST', path: '/v1/rollouts/{rolloutId}/attach', summary: "The rollout's sandbox and last recorded step, to replay from step 0", tag: 'rollouts', params: [rolloutId], reply: 'HttpRolloutView' },
  { operationId: 'exportRollout', method: 'GET', path: '/v1/rollouts/{rolloutId}/export', summary: 'The trajectory as JSON lines, one per step', tag: 'rollouts', params: [rolloutId], reply: 'jsonl' },
  { operationId: 'deleteRollout', method: 'DELETE', path: '/v1/rollouts/{rolloutId}', summary: 'Delete the rollout and its log (`kill=1`: its sandbox too)', tag: 'rollouts', params: [rolloutId, { name: 'kill', in: 'query', description: '`1`: kill its sandbox too', schema: { type: 'boolean' } }], reply: 'none', status: 204 },
  { operationId: 'fnInvoke', method: 'POST', path: '/v1/fn/invoke', summary: 'A one-shot invocation (FnCall): program, stdin or tests, limits in; a judge verdict out', tag: 'fn', params: [{ name: 'retryBusy', in: 'query', description: '`1`: wait and retry while the nodes are busy', schema: { type: 'boolean' } }], request: 'FnInvokeRequest', reply: 'FnInvokeResult' },
  {
    operationId: 'listSnapshots',
    method: 'GET',
    path: '/v1/snapshots',
    summary: 'Snapshots of VM sandboxes on every node, oldest first',
    tag: 'snapshots',
    params: [
      { name: 'node', in: 'query', description: 'only snapshots on this node' },
      { name: 'from', in: 'query', description: 'only snapshots of this sandbox' },
    ],
    reply: 'SnapshotsListReply',
  },
  { operationId: 'deleteSnapshot', method: 'DELETE', path: '/v1/snapshots/{id}', summary: "Remove a snapshot's files from its node (`deleted: false` when there was none)", tag: 'snapshots', params: [{ name: 'id', in: 'path', description: 'the snapshot id', required: true }], reply: 'SnapshotsDeleteReply' },
  { operationId: 'listNodes', method: 'GET', path: '/v1/nodes', summary: 'Heartbeat records of the nodes', tag: 'nodes', reply: 'NodeList' },
  { operationId: 'getNode', method: 'GET', path: '/v1/nodes/{node}', summary: 'What a node reports about itself', tag: 'nodes', params: [{ name: 'node', in: 'path', description: 'the node id', required: true }], reply: 'NodeInfo' },
  {
    operationId: 'events',
    method: 'GET',
    path: '/v1/events',
    summary: 'Lifecycle events as Server-Sent Events (`event: sandbox`, the record after each transition), filtered; `event: gap` (`{events}`) counts events a slow reader missed',
    tag: 'events',
    params: [
      { name: 'id', in: 'query', description: 'one sandbox only' },
      { name: 'group', in: 'query', description: 'one training job only' },
      { name: 'node', in: 'query', description: 'one node only' },
      { name: 'state', in: 'query', description: 'only these states, comma-separated' },
      { name: 'label', in: 'query', description: '`key=value`, repeatable' },
    ],
    reply: 'sse',
    sse: 'SandboxEvents',
  },
  ...(['GET', 'POST', 'PUT', 'DELETE'] as const).map(
    (method): Route => ({
      operationId: `port${method[0]}${method.slice(1).toLowerCase()}`,
      method,
      path: '/v1/sandboxes/{id}/ports/{port}/{rest}',
      summary: 'HTTP to a server listening on `port` inside the sandbox (which needs no network for it): the request goes there as `/{rest}` with its query, headers and body, and its answer comes back as it is',
      tag: 'ports',
      params: [id, { name: 'port', in: 'path', description: 'a TCP port on the sandbox loopback', required: true, schema: { type: 'integer' } }, { name: 'rest', in: 'path', description: 'the rest of the path (may hold slashes)', required: true }],
      request: 'raw',
      reply: 'raw',
      rawBody: true,
    }),
  ),
  { operationId: 'openapi', method: 'GET', path: '/v1/openapi.json', summary: 'This document', tag: 'meta', reply: 'json', public: true },
  { operationId: 'metrics', method: 'GET', path: '/metrics', summary: "The gateway's Prometheus metrics", tag: 'meta', reply: 'prometheus' },
  { operationId: 'health', method: 'GET', path: '/healthz', summary: 'The gateway process answers', tag: 'meta', reply: 'json', public: true },
];

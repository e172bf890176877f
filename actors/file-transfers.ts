/**
 * The node's side of one sandbox's directory uploads, downloads and watches: each is a session
 * named by the caller (uploadId, downloadId, watchId) that lives across requests.
 *
 * Uploads and downloads move one chunk per request and reply. The caller sends (or asks for) the
 * next chunk only when the last was answered, so the node never holds more than a chunk of a
 * transfer, and a slow disk or a busy node slows the caller instead of filling a buffer — the flow
 * control that a stream to an inbox (streamed exec) does not have. Chunks are numbered: one sent
 * again after a lost reply is answered again, never applied twice. A session no caller touches for
 * SESSION_IDLE_MS ends (an upload keeps what it wrote).
 *
 * A watch streams its events to the caller's inbox, as a streamed exec does, and lives on a lease
 * the caller renews: when the caller goes away (its process died, its connection is gone), the
 * lease runs out and the inotify watches are given back.
 */
import type { NatsConnection } from '@nats-io/transport-node';
import type { Logger } from 'pino';
import { encode, type FilesDownloadReply, type FilesDownloadRequest, type FilesUploadReply, type FilesUploadRequest, type FilesWatchRequest, type FileWatchEvent, Limits, ProtocolError, toWireError } from '../protocol/index.ts';
import type { SandboxFiles, TreeUpload } from '../runtime/backend.ts';

/** A transfer with no request for this long is dropped. */
export const SESSION_IDLE_MS = 30_000;
const WATCH_LEASE_MS = Limits.files.watchLeaseMs;
/** Download chunks: a NATS message of the default 1 MiB max payload stays the unit of transfer. */
const DOWNLOAD_CHUNK = 1024 * 1024;
/** Transfers of each kind at once per sandbox. */
const MAX_SESSIONS = 16;
/** Watches at once per sandbox (each also counts its directories against the inotify bounds). */
const MAX_WATCHES = 32;

interface Upload {
  path: string;
  sink: TreeUpload;
  next: number;
  last?: Promise<FilesUploadReply>;
  timer: NodeJS.Timeout;
}

interface Download {
  path: string;
  gen: AsyncGenerator<Uint8Array, void, undefined>;
  next: number;
  last?: Promise<FilesDownloadReply>;
  timer: NodeJS.Timeout;
}

interface Watch {
  close(): void;
  end(reason: string): void;
  lease: NodeJS.Timeout;
}

export class FileTransfers {
  private readonly uploads = new Map<string, Upload>();
  private readonly downloads = new Map<string, Download>();
  private readonly watches = new Map<string, Watch>();
  private closed = false;

  constructor(
    private readonly files: () => SandboxFiles,
    private readonly backend: string,
    private readonly nc: NatsConnection,
    private readonly log: () => Logger,
  ) {}

  private refuse(verb: string): never {
    throw new ProtocolError('INVALID_REQUEST', `backend ${this.backend} cannot '${verb}'`, { detail: { reason: 'unsupported' } });
  }

  async upload(b: FilesUploadRequest): Promise<FilesUploadReply> {
    let s = this.uploads.get(b.uploadId);
    if (!s) {
      if (b.seq !== 0) throw new ProtocolError('NOT_FOUND', `no upload ${b.uploadId} (it ended, failed, or waited over ${SESSION_IDLE_MS / 1000} s for a chunk)`, { detail: { uploadId: b.uploadId } });
      if (this.uploads.size >= MAX_SESSIONS) throw new ProtocolError('BUSY', `${MAX_SESSIONS} uploads run in this sandbox already`, { detail: { retryAfterMs: 1000 } });
      const f = this.files();
      if (!f.upload) this.refuse('files.upload');
      const sink = await f.upload(b.path);
      if (this.closed) {
        await sink.close();
        throw new ProtocolError('NOT_FOUND', 'the sandbox ended');
      }
      s = { path: b.path, sink, next: 0, timer: this.expire(() => this.dropUpload(b.uploadId)) };
      this.uploads.set(b.uploadId, s);
    }
    if (b.path !== s.path) throw new ProtocolError('INVALID_REQUEST', `upload ${b.uploadId} goes to ${s.path}, not ${b.path}`);
    if (b.seq === s.next - 1 && s.last !== undefined) return s.last;
    if (b.seq !== s.next) throw new ProtocolError('INVALID_REQUEST', `upload ${b.uploadId}: chunk ${b.seq} where ${s.next} was expected`, { detail: { expected: s.next } });
    s.next++;
    s.timer.refresh();
    const id = b.uploadId;
    const sess = s;
    s.last = (b.end ? s.sink.end(b.data) : s.sink.write(b.data)).then(
      (r) => {
        // The last reply stays for a resend until the session expires.
        if (b.end) sess.sink = { write: () => Promise.resolve(r), end: () => Promise.resolve(r), close: () => Promise.resolve() };
        return r;
      },
      (e: unknown) => {
        this.dropUpload(id);
        throw e;
      },
    );
    return s.last;
  }

  private dropUpload(id: string): void {
    const s = this.uploads.get(id);
    if (!s) return;
    this.uploads.delete(id);
    clearTimeout(s.timer);
    void s.sink.close().catch((err: unknown) => this.log().warn({ err, uploadId: id }, 'closing an upload failed'));
  }

  async download(b: FilesDownloadRequest): Promise<FilesDownloadReply> {
    let s = this.downloads.get(b.downloadId);
    if (b.cancel) {
      if (s) this.dropDownload(b.downloadId);
      return { data: new Uint8Array(0), eof: true };
    }
    if (!s) {
      if (b.seq !== 0) throw new ProtocolError('NOT_FOUND', `no download ${b.downloadId} (it ended, failed, or waited over ${SESSION_IDLE_MS / 1000} s for a pull)`, { detail: { downloadId: b.downloadId } });
      if (this.downloads.size >= MAX_SESSIONS) throw new ProtocolError('BUSY', `${MAX_SESSIONS} downloads run in this sandbox already`, { detail: { retryAfterMs: 1000 } });
      const f = this.files();
      if (!f.download) this.refuse('files.download');
      if (this.closed) throw new ProtocolError('NOT_FOUND', 'the sandbox ended');
      s = { path: b.path, gen: f.download(b.path), next: 0, timer: this.expire(() => this.dropDownload(b.downloadId)) };
      this.downloads.set(b.downloadId, s);
    }
    if (b.path !== s.path) throw new ProtocolError('INVALID_REQUEST', `download ${b.downloadId} is of ${s.path}, not ${b.path}`);
    if (b.seq === s.next - 1 && s.last !== undefined) return s.last;
    if (b.seq !== s.next) throw new ProtocolError('INVALID_REQUEST', `download ${b.downloadId}: chunk ${b.seq} where ${s.next} was expected`, { detail: { expected: s.next } });
    s.next++;
    s.timer.refresh();
    const id = b.downloadId;
    const gen = s.gen;
    const before = s.last ?? Promise.resolve(undefined);
    s.last = before.then(async () => {
      const parts: Uint8Array[] = [];
      let size = 0;
      try {
        while (size < DOWNLOAD_CHUNK) {
          const r = await gen.next();
          if (r.done) return { data: Buffer.concat(parts), eof: true };
          parts.push(r.value);
          size += r.value.length;
        }
        return { data: Buffer.concat(parts), eof: false };
      } catch (e) {
        this.dropDownload(id);
        throw e;
      }
    });
    return s.last;
  }

  private dropDownload(id: string): void {
    const s = this.downloads.get(id);
    if (!s) return;
    this.downloads.delete(id);
    clearTimeout(s.timer);
    void s.gen.return(undefined).catch(() => {});
  }

  /** Starts a watch streaming to `reply`; resolves after its `ready` event is sent. */
  async watch(b: FilesWatchRequest, reply: string): Promise<void> {
    if (this.watches.has(b.watchId)) throw new ProtocolError('INVALID_REQUEST', `watch ${b.watchId} is already running`);
    if (this.watches.size >= MAX_WATCHES) throw new ProtocolError('BUSY', `${MAX_WATCHES} watches run in this sandbox already`, { detail: { limit: 'watches', max: MAX_WATCHES } });
    const f = this.files();
    if (!f.watch) this.refuse('files.watch');
    let seq = 0;
    const send = (ev: Record<string, unknown>) => {
      try {
        this.nc.publish(reply, encode({ ...ev, s: seq++ } as FileWatchEvent));
      } catch (err) {
        this.log().debug({ err, watchId: b.watchId }, 'watch event not sent');
      }
    };
    let ended = false;
    const end = (why: string | ProtocolError | Error) => {
      if (ended) return;
      ended = true;
      const w = this.watches.get(b.watchId);
      if (w) {
        clearTimeout(w.lease);
        this.watches.delete(b.watchId);
      }
      handle?.close();
      if (typeof why === 'string') send({ t: 'end', reason: why });
      else send({ t: 'error', error: toWireError(why) });
    };
    let handle: { close(): void } | undefined;
    handle = await f.watch(
      b.path,
      b.recursive === true,
      (ev) => send({ t: 'change', ...ev }),
      (reason) => end(reason),
    );
    if (this.closed || ended) {
      handle.close();
      if (this.closed) throw new ProtocolError('NOT_FOUND', 'the sandbox ended');
      return;
    }
    this.watches.set(b.watchId, { close: () => handle?.close(), end, lease: setTimeout(() => end('expired'), WATCH_LEASE_MS) });
    send({ t: 'ready' });
  }

  renew(watchId: string): { watching: boolean; leaseMs: number } {
    const w = this.watches.get(watchId);
    w?.lease.refresh();
    return { watching: w !== undefined, leaseMs: WATCH_LEASE_MS };
  }

  cancel(watchId: string): { watching: boolean; leaseMs: number } {
    const w = this.watches.get(watchId);
    w?.end('cancelled');
    return { watching: w !== undefined, leaseMs: WATCH_LEASE_MS };
  }

  /** The sandbox ended: every watch says so, every transfer stops (an upload keeps what it wrote). */
  closeAll(): void {
    this.closed = true;
    for (const w of [...this.watches.values()]) w.end('sandbox_ended');
    for (const id of [...this.uploads.keys()]) this.dropUpload(id);
    for (const id of [...this.downloads.keys()]) this.dropDownload(id);
  }

  private expire(drop: () => void): NodeJS.Timeout {
    const t = setTimeout(drop, SESSION_IDLE_MS);
    t.unref();
    return t;
  }
}

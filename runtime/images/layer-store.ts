/** What every layer store offers (remote.ts opens one by location). */
import type { BlobInfo, ImageManifest, LayerRef } from './store.ts';

export interface GcResult {
  removed: string[];
  freedBytes: number;
  kept: number;
}

export interface LayerStore {
  /** Where it is, as a person would write it (a path, a URL, `rclone:…`). */
  readonly location: string;
  list(): Promise<string[]>;
  get(name: string): Promise<ImageManifest | null>;
  /** Stores a manifest; every layer it names must already be in the store. */
  put(m: ImageManifest): Promise<ImageManifest>;
  remove(name: string): Promise<void>;
  listBlobs(): Promise<BlobInfo[]>;
  statBlob(digest: string): Promise<BlobInfo | null>;
  /** Uploads a layer blob (and its index) from a local file. */
  pushBlob(ref: LayerRef, file: string, indexFile: string): Promise<void>;
  /** Downloads a whole blob to `dest` as it is; the caller checks its digest. */
  download(digest: string, dest: string): Promise<void>;
  /** Removes unreferenced blobs older than `graceMs`; `inUse`: digests running sandboxes read, kept whatever names them. */
  gc(graceMs: number, inUse?: Iterable<string>): Promise<GcResult>;
  /** An HTTP base URL serving the store's layout with Range requests, for nodes' lazy reads. */
  readUrl(): Promise<string | null>;
  close(): Promise<void>;
}


/**
 * Which directory records a `sandboxes.list` query selects, in listing order: one function, used
 * by the placement replicas that answer the query and by a client reading the bucket itself
 * when no replica is left to ask.
 */
import type { SandboxInfo, SandboxState } from './messages.ts';

/** Listed when no state filter is given and `all` is not set. */
export const LISTED_BY_DEFAULT: ReadonlySet<SandboxState> = new Set(['creating', 'running', 'stopping']);

export interface DirectoryQuery {
  labels?: Record<string, string>;
  group?: string;
  state?: SandboxState[];
  node?: string;
  backend?: string;
  all?: boolean;
  /** Only records after this one in listing order (a page cursor). */
  after?: { createdAt: number; id: string };
}

/** The records `q` selects, oldest first (ties by id). */
export function selectSandboxes(rows: Iterable<SandboxInfo>, q: DirectoryQuery): SandboxInfo[] {
  const states = q.state ? new Set<SandboxState>(q.state) : null;
  const after = q.after;
  return [...rows]
    .filter((info) => {
      if (states ? !states.has(info.state) : !q.all && !LISTED_BY_DEFAULT.has(info.state)) return false;
      if (q.group !== undefined && info.group !== q.group) return false;
      if (q.node !== undefined && info.node !== q.node) return false;
      if (q.backend !== undefined && info.backend !== q.backend) return false;
      if (q.labels && !Object.entries(q.labels).every(([k, v]) => info.labels[k] === v)) return false;
      return !after || info.createdAt > after.createdAt || (info.createdAt === after.createdAt && info.id > after.id);
    })
    .sort((a, b) => a.createdAt - b.createdAt || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
}

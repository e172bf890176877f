/**
 * Command-log settings of a node, from the environment. Kept here rather than in runtime/config.ts
 * so that chronus is one folder; the node reads them when it opens its journal.
 */
import { positiveEnv } from '../protocol/env.ts';
import { Limits } from '../protocol/limits.ts';

export interface ChronusConfig {
  /** Hard cap on the age of any record (the stream's max_age); per-rollout retention sits below it. */
  maxAgeSec: number;
  /** Replicas of the stream and the rollouts bucket; unset: PADDOCK_REPLICAS's rule (1 on a single server, 3 on a cluster of three or more). */
  replicas?: number;
  /** How often a node looks for rollouts whose retention has run out. */
  sweepMs: number;
}

/** How long a rollout's log is kept after its last record, unless the rollout says otherwise. */
export const DEFAULT_RETENTION_SEC = Limits.rollout.retentionSec.default;

export const CHRONUS_ENV_DOC: Record<string, string> = {
  PADDOCK_CHRONUS_MAX_AGE_SEC: 'command log: no record is kept longer than this (default 2592000, 30 days)',
  PADDOCK_CHRONUS_REPLICAS: 'command log: JetStream replicas of the log and the rollouts bucket (default: PADDOCK_REPLICAS, else 3 on a NATS cluster of three or more servers, else 1)',
  PADDOCK_CHRONUS_SWEEP_MS: 'command log: how often a node deletes rollouts past their retention (default 60000)',
};


export function loadChronusConfig(env: NodeJS.ProcessEnv = process.env): ChronusConfig {
  return {
    maxAgeSec: positiveEnv(env, 'PADDOCK_CHRONUS_MAX_AGE_SEC', 30 * 24 * 3600),
    ...(env.PADDOCK_CHRONUS_REPLICAS ? { replicas: Math.round(positiveEnv(env, 'PADDOCK_CHRONUS_REPLICAS', 1)) } : {}),
    sweepMs: positiveEnv(env, 'PADDOCK_CHRONUS_SWEEP_MS', 60_000),
  };
}

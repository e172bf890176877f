/** What one adversarial case reports, shared by the harness (under ava) and run.ts (outside it). */

/** Neighbour exec p50 during an attack may be at most this many times its quiet p50. */
export const NEIGHBOUR_RATIO_MAX = 3;

export interface Row {
  case: string;
  expected: string;
  verdict: string;
  quietMs: number;
  duringMs: number;
  samples: number;
  nodeServes: boolean;
}

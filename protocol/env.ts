/** Settings from the environment, read the same way by every part (node, command log, clients). */

/** A positive number from `env[name]`; `dflt` when unset or empty; an error naming the variable otherwise. */
export function positiveEnv(env: NodeJS.ProcessEnv, name: string, dflt: number): number {
  const v = env[name];
  if (v === undefined || v === '') return dflt;
  const n = Number(v);
  if (!Number.isFinite(n) || n <= 0) throw new Error(`${name}=${v}: must be a positive number`);
  return n;
}

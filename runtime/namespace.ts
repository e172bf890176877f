/**
 * Set in the environment of a node process that runs in its private mount namespace (ops/launch.ts
 * starts it so): only there may the backends mount their tmpfs and layers, which then end with it.
 */
export const NS_MARK = 'PADDOCK_IN_NS';

// The adversarial suite measures a neighbour sandbox's exec latency while each attack runs, so it
// runs on its own, one file at a time (test/adversarial/run.ts sets PADDOCK_TEST_SET): run beside
// the rest of the suite, another file's image builds or fork bombs land in its measurements.
const adversarial = process.env.PADDOCK_TEST_SET === 'adversarial';

export default {
  files: adversarial ? ['test/adversarial/**/*.test.ts'] : ['test/**/*.test.ts', '!test/adversarial/**'],
  extensions: { ts: 'module' },
  nodeArguments: ['--import=tsx'],
  require: ['./test/helpers/worker-mark.ts'],
  workerThreads: false,
  timeout: '120s',
  concurrency: adversarial ? 1 : 2,
};

/** The worker thread of runtime/tree-remove.ts: one walk, its outcome posted back, then it ends. */
import { parentPort, workerData } from 'node:worker_threads';
import { runTreeJob, type TreeJob } from './tree-remove.ts';

parentPort?.postMessage(runTreeJob(workerData as TreeJob));

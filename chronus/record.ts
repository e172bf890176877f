/** The command log's record format lives in protocol/records.ts: the SDK reads records too. */
export * from '../protocol/records.ts';

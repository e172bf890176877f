/**
 * Writes what is generated from the protocol schema: protocol/schema.json (the JSON Schema a
 * gateway or a client in another language reads) and the per-verb table in README.md.
 * `npm run gen:protocol`; test/protocol-schema.test.ts fails when either is stale.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { protocolJsonSchema, withProtocolTable } from '../protocol/api.ts';

const root = join(import.meta.dirname, '..');
writeFileSync(join(root, 'protocol/schema.json'), `${JSON.stringify(protocolJsonSchema(), null, 2)}\n`);
const readme = join(root, 'README.md');
writeFileSync(readme, withProtocolTable(readFileSync(readme, 'utf8')));
console.log('wrote protocol/schema.json and the protocol table in README.md');

#!/usr/bin/env node
// The `paddock` bin: Paddock ships TypeScript sources, so register tsx first. The CLI is imported
// dynamically because a static import would be evaluated before register() runs.
import { register } from 'tsx/esm/api';

register();
await import('../cli.ts');

import pino, { type Logger } from 'pino';

/** JSON logs on stdout; one child logger per sandbox carries its id. */
export function createLogger(name: string, level = process.env.PADDOCK_LOG_LEVEL || 'info'): Logger {
  return pino({ name, level, base: { pid: process.pid } });
}

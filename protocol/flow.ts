/**
 * Flow control of a stream towards its caller (a streamed exec's `window` and `exec.credit`, a
 * port connection's `window` and `ports.credit`): the two ends' arithmetic, kept in one place.
 */

/** The sender's side: bytes sent past the caller's last credit; at a whole window it waits. */
export class SendWindow {
  sent = 0;
  private credited = 0;

  constructor(readonly window?: number) {}

  /** A window or more is out past the last credit (`pending`: bytes about to go, counted as out). */
  full(pending = 0): boolean {
    return this.window !== undefined && this.sent + pending - this.credited >= this.window;
  }

  /** The caller has taken `received` bytes; never more than were sent counts. */
  credit(received: number): void {
    this.credited = Math.max(this.credited, Math.min(received, this.sent));
  }
}

/**
 * The caller's side: bytes received, credited back once its reader has them, in steps of half a
 * window (the sender waits at a whole one, so it never waits on a step in flight for long).
 */
export class Credits {
  private received = 0;
  private credited = 0;

  constructor(
    private readonly window: number,
    private readonly send: (received: number) => void,
  ) {}

  /** Counts bytes received (their credit waits for `offer`). */
  add(bytes: number): void {
    this.received += bytes;
  }

  /** The reader has what was received: credits it, if half a window has gathered. */
  offer(): void {
    if (this.received - this.credited < this.window / 2) return;
    this.credited = this.received;
    try {
      this.send(this.received);
    } catch {
      // NATS away: the next step credits it all (an exec's resume after a reconnect does too).
    }
  }
}

/**
 * The time the store writes (activity times, event timestamps), taken here
 * and sent as a statement parameter rather than read with clock_timestamp()
 * inside the UPDATE: Citus refuses volatile functions in an UPDATE of a
 * distributed table (docs/scaling.md). It keeps the microseconds that
 * clock_timestamp() had, so that lists by activity still tell apart rows
 * written within one millisecond: each reading is the wall clock in
 * microseconds, or one microsecond past the previous reading of this
 * process when the wall clock has not moved on (or went back).
 */
export class WriteClock {
  private lastMicros = 0;

  constructor(private readonly wallClockMs: () => number = Date.now) {}

  /** An ISO 8601 instant with six fractional digits, for a `timestamptz` parameter. */
  now(): string {
    const micros = Math.max(Math.round(this.wallClockMs() * 1000), this.lastMicros + 1);
    this.lastMicros = micros;
    return formatMicros(micros);
  }
}

/** `micros` since the epoch as `YYYY-MM-DDTHH:MM:SS.ffffffZ`. */
export function formatMicros(micros: number): string {
  const ms = Math.floor(micros / 1000);
  const sub = micros - ms * 1000;
  const iso = new Date(ms).toISOString();
  return `${iso.slice(0, -1)}${String(sub).padStart(3, '0')}Z`;
}

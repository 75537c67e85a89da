/** Time and timers, injectable so that idle close and leases are tested without waiting. */
export interface Clock {
  now(): number;
  setInterval(callback: () => void, ms: number): { cancel(): void };
}

export const systemClock: Clock = {
  now: () => Date.now(),
  setInterval(callback, ms) {
    const handle = setInterval(callback, ms);
    handle.unref();
    return { cancel: () => clearInterval(handle) };
  },
};

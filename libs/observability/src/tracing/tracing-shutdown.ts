/** How the process flushes its spans on exit, when tracing was started (see tracing.register.ts). */
let stopper: (() => Promise<void>) | undefined;

export function setTracingStopper(stop: () => Promise<void>): void {
  stopper = stop;
}

/** Sends the buffered spans and stops the SDK; nothing when tracing is off. */
export async function stopTracing(): Promise<void> {
  const stop = stopper;
  stopper = undefined;
  await stop?.();
}

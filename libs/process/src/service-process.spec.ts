import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { runService, runTask } from './service-process.js';

const EVENTS = ['SIGTERM', 'SIGINT', 'uncaughtException', 'unhandledRejection'] as const;
let before: Map<string, Function[]>; // eslint-disable-line @typescript-eslint/no-unsafe-function-type -- listeners of any shape, compared by identity

beforeEach(() => {
  process.env.LOG_LEVEL = 'error';
  before = new Map(EVENTS.map((event) => [event, listenersOf(event)]));
});

afterEach(() => {
  delete process.env.LOG_LEVEL;
  // The handlers a test added: the test process must not keep them.
  for (const event of EVENTS) {
    for (const listener of listenersOf(event))
      if (!before.get(event)!.includes(listener))
        process.off(event, listener as (...args: unknown[]) => void);
  }
});

/** The process's listeners of a signal or an error event, whatever the overload. */
// eslint-disable-next-line @typescript-eslint/no-unsafe-function-type -- listeners of any shape, compared by identity
function listenersOf(event: (typeof EVENTS)[number]): Function[] {
  return (process.listeners as (name: string) => Function[])(event); // eslint-disable-line @typescript-eslint/no-unsafe-function-type
}

/** An exit that records its code instead of ending the test process. */
function exits() {
  const codes: number[] = [];
  let resolve = (_code: number) => undefined as void;
  const next = () => new Promise<number>((r) => (resolve = r));
  let pending = next();
  const exit = ((code: number) => {
    codes.push(code);
    resolve(code);
    pending = next();
  }) as (code: number) => never;
  return { codes, exit, next: () => pending };
}

const tick = () => new Promise((resolve) => setTimeout(resolve, 10));

describe(runService.name, () => {
  it('drains on the first SIGTERM, ignores repeats, and exits 0', async () => {
    const { codes, exit, next } = exits();
    let drains = 0;
    runService(
      { role: 'standalone', drainTimeoutMs: 5_000 },
      () => Promise.resolve({ drain: () => (drains++, tick()).then(() => undefined) }),
      exit,
    );
    await tick();
    const exited = next();
    process.emit('SIGTERM');
    process.emit('SIGTERM');
    process.emit('SIGINT');
    expect(await exited).toBe(0);
    expect(drains).toBe(1);
    expect(codes).toEqual([0]);
  });

  it('exits 1 when the drain fails or outlives its deadline', async () => {
    const failing = exits();
    runService(
      { role: 'standalone', drainTimeoutMs: 5_000 },
      () => Promise.resolve({ drain: () => Promise.reject(new Error('stuck')) }),
      failing.exit,
    );
    await tick();
    const failed = failing.next();
    process.emit('SIGINT');
    expect(await failed).toBe(1);

    for (const event of ['SIGTERM', 'SIGINT'] as const)
      for (const listener of listenersOf(event))
        if (!before.get(event)!.includes(listener)) process.off(event, listener as () => void);
    const hanging = exits();
    runService(
      { role: 'standalone', drainTimeoutMs: 50 },
      () => Promise.resolve({ drain: () => new Promise<void>(() => undefined) }),
      hanging.exit,
    );
    await tick();
    const timedOut = hanging.next();
    process.emit('SIGTERM');
    expect(await timedOut).toBe(1);
  });

  it('exits 1 when the start fails', async () => {
    const { exit, next } = exits();
    const exited = next();
    runService(
      { role: 'standalone', drainTimeoutMs: 1_000 },
      () => Promise.reject(new Error('port in use')),
      exit,
    );
    expect(await exited).toBe(1);
  });
});

describe(runTask.name, () => {
  it('exits 0 when the task succeeded and 1 when it failed', async () => {
    const ok = exits();
    const okExit = ok.next();
    runTask('migrate', () => Promise.resolve(), ok.exit);
    expect(await okExit).toBe(0);
    const failed = exits();
    const failedExit = failed.next();
    runTask('migrate', () => Promise.reject(new Error('no database')), failed.exit);
    expect(await failedExit).toBe(1);
  });
});

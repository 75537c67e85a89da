import { WaitingError } from 'bullmq';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { JobLeases, handBack, type ConversationJob } from './job-lease.js';

const timing = { lockDuration: 1_000, lockRenewTime: 250 };

/** A job whose lock is held by `holder` (null: lapsed); records every extend and move. */
function fakeJob(id = 'conversation-1') {
  const state = {
    holder: null as string | null,
    extends: [] as Array<{ token: string; duration: number }>,
    moves: [] as string[],
    failing: false,
  };
  const job = {
    id,
    extendLock: (token: string, duration: number) => {
      state.extends.push({ token, duration });
      if (state.failing) return Promise.reject(new Error('Connection is closed.'));
      return Promise.resolve(state.holder === token ? 1 : 0);
    },
    moveToWait: (token: string) => {
      state.moves.push(token);
      return Promise.resolve(0);
    },
  } as unknown as ConversationJob;
  return { job, state };
}

const events = () => ({ onLockLost: vi.fn(), onError: vi.fn() });

describe(JobLeases.name, () => {
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => vi.useRealTimers());

  it('renews the lock by its own token every lockRenewTime, for lockDuration', async () => {
    const { job, state } = fakeJob();
    state.holder = 'run-1';
    const on = events();
    const lease = new JobLeases(timing).hold(job, 'run-1', on);
    await vi.advanceTimersByTimeAsync(249);
    expect(state.extends).toEqual([]);
    await vi.advanceTimersByTimeAsync(1);
    await vi.advanceTimersByTimeAsync(500);
    expect(state.extends).toEqual(Array(3).fill({ token: 'run-1', duration: 1_000 }));
    expect(on.onLockLost).not.toHaveBeenCalled();
    lease.release();
    await vi.advanceTimersByTimeAsync(1_000);
    expect(state.extends).toHaveLength(3);
  });

  it("keeps the newer run's lock renewed when an earlier run of the same job ends", async () => {
    const { job, state } = fakeJob();
    const leases = new JobLeases(timing);
    state.holder = 'run-1';
    const earlier = leases.hold(job, 'run-1', events());
    // The lock lapsed and the job was handed out again, to this worker.
    state.holder = 'run-2';
    const newer = events();
    leases.hold(job, 'run-2', newer);
    earlier.release();
    state.extends.length = 0;
    await vi.advanceTimersByTimeAsync(1_000);
    expect(state.extends).toEqual(Array(4).fill({ token: 'run-2', duration: 1_000 }));
    expect(newer.onLockLost).not.toHaveBeenCalled();
  });

  it('tells when a renewal finds the lock gone or taken, and goes on trying', async () => {
    const { job, state } = fakeJob();
    state.holder = 'run-2';
    const on = events();
    new JobLeases(timing).hold(job, 'run-1', on);
    await vi.advanceTimersByTimeAsync(500);
    expect(on.onLockLost).toHaveBeenCalledTimes(2);
    expect(on.onError).not.toHaveBeenCalled();
  });

  it('reports a renewal that failed (Redis away) as an error, not as a lost lock', async () => {
    const { job, state } = fakeJob();
    state.failing = true;
    const on = events();
    new JobLeases(timing).hold(job, 'run-1', on);
    await vi.advanceTimersByTimeAsync(250);
    expect(on.onError).toHaveBeenCalledTimes(1);
    expect(on.onLockLost).not.toHaveBeenCalled();
  });

  it('stops every renewal on releaseAll (a kill), and renews no run held after it', async () => {
    const { job, state } = fakeJob();
    state.holder = 'run-1';
    const leases = new JobLeases(timing);
    leases.hold(job, 'run-1', events());
    leases.hold(fakeJob('conversation-2').job, 'run-x', events());
    leases.releaseAll();
    leases.hold(job, 'run-1', events());
    await vi.advanceTimersByTimeAsync(1_000);
    expect(state.extends).toEqual([]);
  });

  it('hands the job back by its token and stops renewing', async () => {
    const { job, state } = fakeJob();
    state.holder = 'run-1';
    const lease = new JobLeases(timing).hold(job, 'run-1', events());
    await expect(lease.handBack()).rejects.toBeInstanceOf(WaitingError);
    expect(state.moves).toEqual(['run-1']);
    await vi.advanceTimersByTimeAsync(1_000);
    expect(state.extends).toEqual([]);
    await expect(handBack(job, 'run-2')).rejects.toBeInstanceOf(WaitingError);
    expect(state.moves).toEqual(['run-1', 'run-2']);
  });
});

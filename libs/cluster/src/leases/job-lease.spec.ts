import { WaitingError } from 'bullmq';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { JobLeases, handBack, type ConversationJob } from './job-lease.js';

const timing = { lockDuration: 1_000, lockRenewTime: 250 };

/**
 * The locks as Redis holds them (job id → token) and BullMQ's batched
 * renewal over them: records each call, fails the ids whose lock is gone or
 * held by another token, or rejects altogether while `failing`.
 */
function fakeLocks() {
  const state = {
    holders: new Map<string, string>(),
    calls: [] as Array<{ ids: string[]; tokens: string[]; duration: number }>,
    /** The queue of each call. */
    queues: [] as string[],
    moves: [] as string[],
    failing: false as boolean | string,
  };
  const extendLocks = (queue: string, ids: string[], tokens: string[], duration: number) => {
    state.calls.push({ ids, tokens, duration });
    state.queues.push(queue);
    if (state.failing === true || state.failing === queue)
      return Promise.reject(new Error('Connection is closed.'));
    return Promise.resolve(ids.filter((id, i) => state.holders.get(id) !== tokens[i]));
  };
  const job = (id: string, queueName = '{conversations}') =>
    ({
      id,
      queueName,
      moveToWait: (token: string) => {
        state.moves.push(token);
        return Promise.resolve(0);
      },
    }) as unknown as ConversationJob;
  return { state, extendLocks, job };
}

const events = () => ({ onLockLost: vi.fn(), onError: vi.fn() });

describe(JobLeases.name, () => {
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => vi.useRealTimers());

  it("renews the locks of each queue in a call of that queue's own, and a failing queue fails only its runs", async () => {
    const { state, extendLocks, job } = fakeLocks();
    state.holders.set('c-1', 'run-1').set('c-2', 'run-2').set('c-3', 'run-3');
    const leases = new JobLeases(timing, extendLocks);
    const [a, b] = [events(), events()];
    leases.hold(job('c-1', '{conversations-0-1}'), 'run-1', a);
    leases.hold(job('c-2', '{conversations-1-43}'), 'run-2', b);
    leases.hold(job('c-3', '{conversations-0-1}'), 'run-3', a);
    await vi.advanceTimersByTimeAsync(250);
    expect(state.queues).toEqual(['{conversations-0-1}', '{conversations-1-43}']);
    expect(state.calls).toEqual([
      { ids: ['c-1', 'c-3'], tokens: ['run-1', 'run-3'], duration: 1_000 },
      { ids: ['c-2'], tokens: ['run-2'], duration: 1_000 },
    ]);
    state.failing = '{conversations-1-43}';
    await vi.advanceTimersByTimeAsync(250);
    expect(b.onError).toHaveBeenCalledTimes(1);
    expect(a.onError).not.toHaveBeenCalled();
    expect(a.onLockLost).not.toHaveBeenCalled();
  });

  it('renews every held lock by its own token in one call each lockRenewTime, for lockDuration', async () => {
    const { state, extendLocks, job } = fakeLocks();
    state.holders.set('c-1', 'run-1').set('c-2', 'run-2');
    const leases = new JobLeases(timing, extendLocks);
    const on = events();
    const first = leases.hold(job('c-1'), 'run-1', on);
    leases.hold(job('c-2'), 'run-2', on);
    await vi.advanceTimersByTimeAsync(249);
    expect(state.calls).toEqual([]);
    await vi.advanceTimersByTimeAsync(501);
    expect(state.calls).toEqual(
      Array(3).fill({ ids: ['c-1', 'c-2'], tokens: ['run-1', 'run-2'], duration: 1_000 }),
    );
    expect(on.onLockLost).not.toHaveBeenCalled();
    first.release();
    state.calls.length = 0;
    await vi.advanceTimersByTimeAsync(250);
    expect(state.calls).toEqual([{ ids: ['c-2'], tokens: ['run-2'], duration: 1_000 }]);
  });

  it('renews nothing, and keeps no timer, once no lock is held', async () => {
    const { state, extendLocks, job } = fakeLocks();
    const lease = new JobLeases(timing, extendLocks).hold(job('c-1'), 'run-1', events());
    lease.release();
    expect(vi.getTimerCount()).toBe(0);
    await vi.advanceTimersByTimeAsync(1_000);
    expect(state.calls).toEqual([]);
  });

  it("renews only the newer run's lock of a job handed out again, also once the earlier run ends", async () => {
    const { state, extendLocks, job } = fakeLocks();
    const leases = new JobLeases(timing, extendLocks);
    state.holders.set('c-1', 'run-1');
    const earlier = leases.hold(job('c-1'), 'run-1', events());
    // The lock lapsed and the job was handed out again, to this worker.
    state.holders.set('c-1', 'run-2');
    const newer = events();
    leases.hold(job('c-1'), 'run-2', newer);
    await vi.advanceTimersByTimeAsync(250);
    earlier.release();
    await vi.advanceTimersByTimeAsync(750);
    expect(state.calls).toEqual(
      Array(4).fill({ ids: ['c-1'], tokens: ['run-2'], duration: 1_000 }),
    );
    expect(newer.onLockLost).not.toHaveBeenCalled();
  });

  it('tells the run whose lock is gone or taken, and goes on trying', async () => {
    const { state, extendLocks, job } = fakeLocks();
    state.holders.set('c-1', 'someone-else').set('c-2', 'run-2');
    const lost = events();
    const kept = events();
    const leases = new JobLeases(timing, extendLocks);
    leases.hold(job('c-1'), 'run-1', lost);
    leases.hold(job('c-2'), 'run-2', kept);
    await vi.advanceTimersByTimeAsync(500);
    expect(lost.onLockLost).toHaveBeenCalledTimes(2);
    expect(kept.onLockLost).not.toHaveBeenCalled();
    expect(lost.onError).not.toHaveBeenCalled();
  });

  it('reports a renewal that failed (Redis away) as an error to every run, not as a lost lock', async () => {
    const { state, extendLocks, job } = fakeLocks();
    state.failing = true;
    const on = events();
    const leases = new JobLeases(timing, extendLocks);
    leases.hold(job('c-1'), 'run-1', on);
    leases.hold(job('c-2'), 'run-2', on);
    await vi.advanceTimersByTimeAsync(250);
    expect(on.onError).toHaveBeenCalledTimes(2);
    expect(on.onLockLost).not.toHaveBeenCalled();
  });

  it('stops every renewal on releaseAll (a kill), and renews no run held after it', async () => {
    const { state, extendLocks, job } = fakeLocks();
    state.holders.set('c-1', 'run-1');
    const leases = new JobLeases(timing, extendLocks);
    leases.hold(job('c-1'), 'run-1', events());
    leases.hold(job('c-2'), 'run-x', events());
    leases.releaseAll();
    leases.hold(job('c-1'), 'run-1', events());
    await vi.advanceTimersByTimeAsync(1_000);
    expect(state.calls).toEqual([]);
  });

  it('hands the job back by its token and stops renewing', async () => {
    const { state, extendLocks, job } = fakeLocks();
    state.holders.set('c-1', 'run-1');
    const one = job('c-1');
    const lease = new JobLeases(timing, extendLocks).hold(one, 'run-1', events());
    await expect(lease.handBack()).rejects.toBeInstanceOf(WaitingError);
    expect(state.moves).toEqual(['run-1']);
    await vi.advanceTimersByTimeAsync(1_000);
    expect(state.calls).toEqual([]);
    await expect(handBack(one, 'run-2')).rejects.toBeInstanceOf(WaitingError);
    expect(state.moves).toEqual(['run-1', 'run-2']);
  });
});

import { describe, expect, it } from 'vitest';
import type { ConversationRecord, ConversationRef, LiveConversationPage } from '@cs/core';
import { ConcurrencyLimitError } from '@cs/core';
import type { ConversationStatus } from '@cs/protocol';
import { ClusterKeys } from '../redis/cluster-keys.js';
import { LostJobReconciler, RECONCILE_PAGE } from './lost-job-reconciler.js';

const LEASE_TTL_MS = 2_000;
const LONG_AGO = new Date(Date.now() - 60_000);

interface Row {
  ref: ConversationRef;
  status: ConversationStatus;
  updatedAt: Date;
}

/**
 * The reconciler over fakes: conversations as Postgres holds them, jobs by
 * conversation id, stop marks, and the starts and stops it asked for.
 */
function fixture(count = 3) {
  const rows = new Map<string, Row>();
  for (let n = 0; n < count; n += 1) {
    const id = `c-${String(n).padStart(4, '0')}`;
    const ref = { tenantId: 't', userId: 'u', conversationId: id, incarnation: 'i1' };
    rows.set(id, { ref, status: 'RUNNING', updatedAt: LONG_AGO });
  }
  const state = {
    jobs: new Map<string, string>(),
    marks: new Map<string, number>(),
    started: [] as string[],
    stopped: [] as string[],
    pages: 0,
    reconciled: 0,
    warnings: [] as Array<Record<string, unknown> | undefined>,
    lock: 'OK' as string | null,
    /** Runs when the reconciler asks for a job's state (what happens meanwhile). */
    onState: (_id: string): void => undefined,
    onStart: (_id: string): void => undefined,
  };
  const reconciler = new LostJobReconciler({
    store: {
      listLiveConversations(page: LiveConversationPage) {
        state.pages += 1;
        const live = [...rows.values()]
          .filter((row) => row.status === 'STARTING' || row.status === 'RUNNING')
          .filter((row) => row.updatedAt < page.idleBefore)
          .filter((row) => page.afterId === null || row.ref.conversationId > page.afterId)
          .sort((a, b) => a.ref.conversationId.localeCompare(b.ref.conversationId));
        return Promise.resolve(live.slice(0, page.limit).map((row) => row.ref));
      },
      getConversation(_tenantId: string, id: string) {
        const row = rows.get(id);
        if (!row) return Promise.resolve(null);
        return Promise.resolve({
          incarnation: row.ref.incarnation,
          status: row.status,
          updatedAt: row.updatedAt,
        } as ConversationRecord);
      },
    },
    jobs: {
      state(id: string) {
        state.onState(id);
        return Promise.resolve(state.jobs.get(id) ?? null);
      },
    },
    stops: { read: (id: string) => Promise.resolve(state.marks.get(id) ?? 0) },
    manager: {
      ensureRunning(ref: ConversationRef) {
        state.started.push(ref.conversationId);
        state.onStart(ref.conversationId);
        state.jobs.set(ref.conversationId, 'waiting');
        return Promise.resolve('STARTING' as const);
      },
      stop(ref: ConversationRef) {
        state.stopped.push(ref.conversationId);
        return Promise.resolve('STOPPED' as const);
      },
    },
    redis: { set: () => Promise.resolve(state.lock) } as never,
    keys: new ClusterKeys('test'),
    workerId: 'w1',
    leaseTtlMs: LEASE_TTL_MS,
    log: (_level, _message, fields) => state.warnings.push(fields),
    metrics: {
      leaseAcquired: () => undefined,
      failover: () => undefined,
      handoff: () => undefined,
      wakeupPickedUp: () => undefined,
      limitEviction: () => undefined,
      limitRejection: () => undefined,
      reconciled: () => {
        state.reconciled += 1;
      },
    },
  });
  return { reconciler, rows, state };
}

describe('LostJobReconciler', () => {
  it('starts again the live conversations whose job is gone, and only those', async () => {
    const { reconciler, rows, state } = fixture(4);
    state.jobs.set('c-0000', 'active');
    state.jobs.set('c-0001', 'waiting');
    rows.get('c-0003')!.status = 'STOPPED';
    expect(await reconciler.runIfLocked()).toBe(1);
    expect(state.started).toEqual(['c-0002']);
    expect(state.reconciled).toBe(1);
    expect(state.warnings).toContainEqual(expect.objectContaining({ conversation_id: 'c-0002' }));
    // Its job exists now: the next pass leaves it alone.
    expect(await reconciler.runIfLocked()).toBe(0);
  });

  it('leaves conversations active within a lease TTL to their holders', async () => {
    const { reconciler, rows, state } = fixture(1);
    rows.get('c-0000')!.updatedAt = new Date();
    expect(await reconciler.runIfLocked()).toBe(0);
    expect(state.started).toEqual([]);
  });

  it('runs no pass without the lock', async () => {
    const { reconciler, state } = fixture(2);
    state.lock = null;
    expect(await reconciler.runIfLocked()).toBe(0);
    expect(state.pages).toBe(0);
    expect(state.started).toEqual([]);
  });

  it('starts nothing whose run ended between the page and its job check', async () => {
    const { reconciler, rows, state } = fixture(1);
    // A run that ends sets STOPPED before its job goes.
    state.onState = (id) => {
      rows.get(id)!.status = 'STOPPED';
    };
    expect(await reconciler.runIfLocked()).toBe(0);
    expect(state.started).toEqual([]);
  });

  it('starts nothing whose id was used again by a new conversation', async () => {
    const { reconciler, rows, state } = fixture(1);
    state.onState = (id) => {
      rows.get(id)!.ref = { ...rows.get(id)!.ref, incarnation: 'i2' };
    };
    expect(await reconciler.runIfLocked()).toBe(0);
    expect(state.started).toEqual([]);
  });

  it('stops again a conversation whose stop landed while it started it', async () => {
    const { reconciler, state } = fixture(1);
    state.onStart = (id) => state.marks.set(id, 1);
    expect(await reconciler.runIfLocked()).toBe(1);
    expect(state.stopped).toEqual(['c-0000']);
  });

  it('keeps going past a conversation it could not start', async () => {
    const { reconciler, state } = fixture(2);
    state.onStart = (id) => {
      if (id === 'c-0000') throw new ConcurrencyLimitError(1);
    };
    expect(await reconciler.runIfLocked()).toBe(1);
    expect(state.started).toEqual(['c-0000', 'c-0001']);
    expect(state.warnings).toContainEqual({ conversation_id: 'c-0000' });
  });

  it('pages through every live conversation', async () => {
    const { reconciler, state } = fixture(RECONCILE_PAGE + 5);
    expect(await reconciler.runIfLocked()).toBe(RECONCILE_PAGE + 5);
    expect(state.pages).toBe(2);
  });
});

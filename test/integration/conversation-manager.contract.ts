// The behaviour every ConversationManager must have, whether it runs sessions
// in-process (standalone) or leases them to workers (cluster). Each backend's
// `*.contract.int-spec.ts` supplies a fixture and calls
// `conversationManagerContract`; the cases below know nothing of the backend.
//
// Cases wait for outcomes with `vi.waitFor` and never for time: a manager may
// act asynchronously (the cluster's gateway returns before a worker acts), so
// where the interface does not promise a synchronous effect the case waits
// for it; where it does (a stored user event, a refusal) it asserts at once.
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import {
  ConcurrencyLimitError,
  ConflictError,
  NO_CLUSTER_METRICS,
  readAgentStateChange,
  type ClusterMetrics,
  type ConversationManager,
  type ConversationRecord,
  type ConversationRef,
} from '@cs/core';
import {
  StatusId,
  isAction,
  type AgentState,
  type ConversationStatus,
  type StatusUpdate,
  type StoredEvent,
  type UserAction,
} from '@cs/protocol';
import { uniqueName } from '../support/services.js';

export interface ContractManagerOptions {
  maxConcurrentConversations: number;
  concurrencyPolicy: 'evict_oldest' | 'reject';
  /** Where the manager counts the limit's evictions and refusals. */
  metrics: ClusterMetrics;
}

export interface ConversationOwner {
  tenantId: string;
  userId: string;
}

/** What a backend provides to the contract. */
export interface ConversationManagerFixture {
  /**
   * A manager of this backend with these per-user limits, closed by
   * `teardown`. Managers of one fixture share its store (and, in a cluster,
   * its Redis and workers); each case uses its own tenant.
   */
  createManager(options: ContractManagerOptions): Promise<ConversationManager>;
  /** Stores a new, never started conversation of `owner` that runs the echo agent. */
  createConversation(owner: ConversationOwner): Promise<ConversationRef>;
  /** Every stored event of the conversation, in id order. */
  storedEvents(ref: ConversationRef): Promise<StoredEvent[]>;
  /** The stored conversation row. */
  storedConversation(ref: ConversationRef): Promise<ConversationRecord | null>;
  /** Stored events published to the conversation's room so far, in the order they arrived. */
  publishedEvents(conversationId: string): StoredEvent[];
  /** Status updates published to the conversation's room so far. */
  publishedStatuses(conversationId: string): StatusUpdate[];
  /**
   * Resolves once no process holds the conversation's agent nor will take it
   * unless asked again (in a cluster: its lease job is neither queued nor
   * active). Immediate where `stop()` itself waits until the session is gone.
   */
  untilUnheld(ref: ConversationRef): Promise<void>;
  /** The names `runtime(ref).workerId` may take: the processes that run agents. */
  readonly agentHosts: readonly string[];
  teardown(): Promise<void>;
}

const LIMIT = 2;
const TOO_MANY = StatusId.TooManyConversations;
/**
 * How many conversations the cases about races run through at once. A race
 * shows in some runs only; several rounds make a broken manager fail the case
 * nearly always instead of now and then.
 */
const ROUNDS = 6;

/** Polls until `check` passes; a cluster start (Redis, BullMQ, Postgres) takes well under 1 s. */
function eventually<T>(check: () => T | Promise<T>): Promise<T> {
  return vi.waitFor(check, { timeout: 10_000, interval: 25 });
}

/** Runs `round` for each item at once, waits for all, then fails with the first failure. */
async function inRounds<T>(items: readonly T[], round: (item: T) => Promise<void>): Promise<void> {
  const results = await Promise.allSettled(items.map(round));
  const failed = results.flatMap((r, index) =>
    r.status === 'rejected' ? [{ index, reason: r.reason as unknown }] : [],
  );
  if (failed.length > 0) {
    const first = failed[0]!;
    const error = first.reason instanceof Error ? first.reason : new Error(String(first.reason));
    error.message = `${failed.length} of ${items.length} rounds failed; round ${first.index}: ${error.message}`;
    throw error;
  }
}

function message(content: string, clientEventId?: string): UserAction {
  return {
    action: 'message',
    args: { content, image_urls: [], file_urls: [] },
    ...(clientEventId === undefined ? {} : { client_event_id: clientEventId }),
  };
}

function changeAgentState(agentState: 'stopped' | 'paused' | 'running'): UserAction {
  return { action: 'change_agent_state', args: { agent_state: agentState } };
}

interface StateChange {
  id: number;
  agentState: AgentState;
  reason: string | undefined;
  cause: number | undefined;
}

function stateChanges(events: readonly StoredEvent[]): StateChange[] {
  return events.flatMap((event) => {
    const change = readAgentStateChange(event);
    return change
      ? [{ id: event.id, agentState: change.agentState, reason: change.reason, cause: event.cause }]
      : [];
  });
}

/** The agent's messages answering the user event `userEventId`. */
function answersTo(events: readonly StoredEvent[], userEventId: number): StoredEvent[] {
  return events.filter(
    (e) => e.source === 'agent' && isAction(e) && e.action === 'message' && e.cause === userEventId,
  );
}

function contentOf(event: StoredEvent | undefined): unknown {
  return event && isAction(event) ? event.args['content'] : undefined;
}

/** The agent state last stored, or null when none was. */
function lastState(events: readonly StoredEvent[]): AgentState | null {
  return stateChanges(events).at(-1)?.agentState ?? null;
}

function countOf(events: readonly StoredEvent[], state: AgentState): number {
  return stateChanges(events).filter((c) => c.agentState === state).length;
}

/**
 * A manager's `ClusterMetrics` that counts the limit's evictions and
 * refusals; `since()` says how many of each since it was last called.
 */
function limitCounts(): { metrics: ClusterMetrics; since(): { evicted: number; refused: number } } {
  let evicted = 0;
  let refused = 0;
  return {
    metrics: {
      ...NO_CLUSTER_METRICS,
      limitEviction: () => {
        evicted += 1;
      },
      limitRejection: () => {
        refused += 1;
      },
    },
    since() {
      const counts = { evicted, refused };
      evicted = 0;
      refused = 0;
      return counts;
    },
  };
}

export function conversationManagerContract(
  name: string,
  makeFixture: () => Promise<ConversationManagerFixture>,
): void {
  describe(`ConversationManager contract: ${name}`, () => {
    let fixture: ConversationManagerFixture;

    beforeAll(async () => {
      fixture = await makeFixture();
    });

    afterAll(async () => {
      await fixture?.teardown();
    });

    const newOwner = (): ConversationOwner => ({ tenantId: uniqueName('tenant'), userId: 'alice' });
    /** Three conversations of `owner`, created one after the other. */
    const threeConversations = async (
      owner: ConversationOwner,
    ): Promise<[ConversationRef, ConversationRef, ConversationRef]> => [
      await fixture.createConversation(owner),
      await fixture.createConversation(owner),
      await fixture.createConversation(owner),
    ];
    const stored = (ref: ConversationRef) => fixture.storedEvents(ref);

    /**
     * Waits until an agent started at or after event `sinceId` has settled in
     * `awaiting_user_input` (a `loading` and then a ready state stored).
     */
    async function waitUntilReady(ref: ConversationRef, sinceId = 0): Promise<StoredEvent[]> {
      return eventually(async () => {
        const events = await stored(ref);
        const changes = stateChanges(events);
        const loading = changes.findLastIndex((c) => c.agentState === 'loading');
        expect(loading, 'a new loading').toBeGreaterThanOrEqual(0);
        expect(changes[loading]!.id, 'a new loading').toBeGreaterThanOrEqual(sinceId);
        expect(changes.slice(loading + 1).map((c) => c.agentState)).toContain(
          'awaiting_user_input',
        );
        return events;
      });
    }

    /** Waits for the settled answer to a user event; returns the stored events then. */
    async function waitForAnswer(ref: ConversationRef, userEventId: number) {
      return eventually(async () => {
        const events = await stored(ref);
        expect(answersTo(events, userEventId)).not.toHaveLength(0);
        // The answer and its settling state change are stored in one batch.
        expect(
          stateChanges(events).some(
            (c) => c.cause === userEventId && c.agentState === 'awaiting_user_input',
          ),
        ).toBe(true);
        return events;
      });
    }

    async function waitForStatus(
      manager: ConversationManager,
      ref: ConversationRef,
      status: ConversationStatus,
    ): Promise<void> {
      await eventually(async () => expect(await manager.status(ref)).toBe(status));
    }

    /** Starts the conversation and waits until its agent awaits input. */
    async function startAndWait(manager: ConversationManager, ref: ConversationRef) {
      await manager.ensureRunning(ref);
      await waitUntilReady(ref);
      await waitForStatus(manager, ref, 'RUNNING');
    }

    const owners = (count: number) => Array.from({ length: count }, newOwner);

    function expectPublishedOnce(conversationId: string, events: readonly StoredEvent[]): void {
      const published = fixture.publishedEvents(conversationId).map((e) => e.id);
      for (const event of events) {
        expect(
          published.filter((id) => id === event.id),
          `event ${event.id}`,
        ).toHaveLength(1);
      }
    }

    describe('with evict_oldest', () => {
      let manager: ConversationManager;
      const counts = limitCounts();

      beforeAll(async () => {
        manager = await fixture.createManager({
          maxConcurrentConversations: LIMIT,
          concurrencyPolicy: 'evict_oldest',
          metrics: counts.metrics,
        });
      });

      it('claims no slot before storing: nothing is refused', async () => {
        const ref = await fixture.createConversation(newOwner());
        expect(await manager.claimSlot(ref)).toBeNull();
      });

      it('starts a stopped conversation: its agent reaches awaiting_user_input', async () => {
        const ref = await fixture.createConversation(newOwner());
        expect(await manager.status(ref)).toBe('STOPPED');
        expect(await manager.listRunning(ref.tenantId, ref.userId)).toEqual([]);

        expect(['STARTING', 'RUNNING']).toContain(await manager.ensureRunning(ref));

        const events = await waitUntilReady(ref);
        await waitForStatus(manager, ref, 'RUNNING');
        expect(stateChanges(events).map((c) => c.agentState)).toEqual([
          'loading',
          'awaiting_user_input',
        ]);
        expect(await manager.listRunning(ref.tenantId, ref.userId)).toEqual([ref.conversationId]);
        await eventually(() =>
          expect(fixture.publishedEvents(ref.conversationId).map((e) => e.id)).toEqual(
            events.map((e) => e.id),
          ),
        );
      });

      it('starts one session for concurrent calls and reuses it later (one loading per start)', async () => {
        const ref = await fixture.createConversation(newOwner());
        const starting = await Promise.all([
          manager.ensureRunning(ref),
          manager.ensureRunning(ref),
          manager.ensureRunning(ref),
        ]);
        for (const status of starting) expect(['STARTING', 'RUNNING']).toContain(status);
        await waitUntilReady(ref);
        await waitForStatus(manager, ref, 'RUNNING');

        expect(await manager.ensureRunning(ref)).toBe('RUNNING');
        expect(await Promise.all([manager.ensureRunning(ref), manager.ensureRunning(ref)])).toEqual(
          ['RUNNING', 'RUNNING'],
        );

        // A message answered after the repeats proves that the session they found still runs.
        const { event } = await manager.sendUserAction(ref, message('still one session'));
        const events = await waitForAnswer(ref, event.id);
        expect(countOf(events, 'loading')).toBe(1);
        expect(answersTo(events, event.id)).toHaveLength(1);
        expect(await manager.listRunning(ref.tenantId, ref.userId)).toEqual([ref.conversationId]);
      });

      it('stores a message once per idempotency key and answers it exactly once', async () => {
        const ref = await fixture.createConversation(newOwner());
        await startAndWait(manager, ref);
        const key = `key-${randomUUID()}`;

        const first = await manager.sendUserAction(ref, message('hello, verbatim', key));
        expect(first.duplicate).toBe(false);
        expect(first.event).toMatchObject({
          source: 'user',
          action: 'message',
          args: { content: 'hello, verbatim' },
          client_event_id: key,
        });
        const userEventId = first.event.id;

        const repeat = await manager.sendUserAction(ref, message('hello, verbatim', key));
        expect(repeat).toEqual({ event: first.event, duplicate: true });
        const viaKey = await manager.sendUserAction(ref, message('hello, verbatim'), key);
        expect(viaKey.duplicate).toBe(true);
        expect(viaKey.event.id).toBe(userEventId);
        const conflict = manager.sendUserAction(ref, message('other content', key));
        await expect(conflict).rejects.toBeInstanceOf(ConflictError);
        await expect(conflict).rejects.toMatchObject({ code: 'CONFLICT' });

        const events = await waitForAnswer(ref, userEventId);
        const answers = answersTo(events, userEventId);
        expect(answers).toHaveLength(1);
        expect(contentOf(answers[0])).toEqual(expect.stringContaining('hello, verbatim'));
        expect(events.filter((e) => e.source === 'user')).toHaveLength(1);

        // A later message is answered after it: had the repeats been taken for new
        // messages, their answers would be stored before this one settles.
        const next = await manager.sendUserAction(ref, message('next'));
        const after = await waitForAnswer(ref, next.event.id);
        expect(after.filter((e) => e.source === 'user').map((e) => e.id)).toEqual([
          userEventId,
          next.event.id,
        ]);
        expect(answersTo(after, userEventId)).toHaveLength(1);
        expect(after.filter((e) => e.source === 'agent')).toHaveLength(2);

        await eventually(() => expectPublishedOnce(ref.conversationId, after));
      });

      it('starts a never started conversation when a message arrives, and answers it', async () => {
        const ref = await fixture.createConversation(newOwner());
        expect(await manager.status(ref)).toBe('STOPPED');

        const { event, duplicate } = await manager.sendUserAction(ref, message('wake up'));
        expect(duplicate).toBe(false);

        const events = await waitForAnswer(ref, event.id);
        expect(answersTo(events, event.id)).toHaveLength(1);
        expect(contentOf(answersTo(events, event.id)[0])).toEqual(
          expect.stringContaining('wake up'),
        );
        expect(countOf(events, 'loading')).toBe(1);
        await waitForStatus(manager, ref, 'RUNNING');
      });

      it('does not start a stopped conversation for a change_agent_state action', async () => {
        const ref = await fixture.createConversation(newOwner());
        const { event } = await manager.sendUserAction(ref, changeAgentState('running'));
        expect(event).toMatchObject({ source: 'user', action: 'change_agent_state' });
        expect(await manager.status(ref)).toBe('STOPPED');
        expect(await manager.listRunning(ref.tenantId, ref.userId)).toEqual([]);
      });

      it('stops a running conversation: STOPPED, a stored `stopped`, no runtime', async () => {
        const ref = await fixture.createConversation(newOwner());
        await startAndWait(manager, ref);

        await manager.stop(ref);

        await waitForStatus(manager, ref, 'STOPPED');
        await fixture.untilUnheld(ref);
        const events = await stored(ref);
        expect(lastState(events)).toBe('stopped');
        expect(countOf(events, 'stopped')).toBe(1);
        expect(await manager.listRunning(ref.tenantId, ref.userId)).toEqual([]);
        expect(await manager.runtime(ref)).toBeNull();
        expect((await fixture.storedConversation(ref))?.status).toBe('STOPPED');

        // Stopping again is a no-op.
        await manager.stop(ref);
        expect(await manager.status(ref)).toBe('STOPPED');
        expect(countOf(await stored(ref), 'stopped')).toBe(1);
      });

      it('stops a conversation that is still starting', async () => {
        await inRounds(owners(ROUNDS), async (owner) => {
          const ref = await fixture.createConversation(owner);
          await manager.ensureRunning(ref);
          await manager.stop(ref);

          // Whatever the stop raced with has played out once nothing holds the conversation.
          await fixture.untilUnheld(ref);
          expect(await manager.status(ref)).toBe('STOPPED');
          const events = await stored(ref);
          // Either the agent never started, or it started and then stopped.
          if (countOf(events, 'loading') > 0) expect(lastState(events)).toBe('stopped');
          expect(await manager.listRunning(ref.tenantId, ref.userId)).toEqual([]);
          expect(await manager.runtime(ref)).toBeNull();
        });
      });

      it('restarts a stopped conversation with its history and answers new messages', async () => {
        const ref = await fixture.createConversation(newOwner());
        const first = await manager.sendUserAction(ref, message('before the stop'));
        await waitForAnswer(ref, first.event.id);
        await waitForStatus(manager, ref, 'RUNNING');
        const epochBefore = (await manager.runtime(ref))?.leaseEpoch;
        await manager.stop(ref);
        await waitForStatus(manager, ref, 'STOPPED');
        const history = await stored(ref);

        expect(['STARTING', 'RUNNING']).toContain(await manager.ensureRunning(ref));
        await waitUntilReady(ref, history.length);
        await waitForStatus(manager, ref, 'RUNNING');
        const second = await manager.sendUserAction(ref, message('after the restart'));
        expect(second.event.id).toBeGreaterThan(history.at(-1)!.id);

        const events = await waitForAnswer(ref, second.event.id);
        expect(events.slice(0, history.length)).toEqual(history);
        expect(answersTo(events, first.event.id)).toHaveLength(1);
        expect(answersTo(events, second.event.id)).toHaveLength(1);
        expect(countOf(events, 'loading')).toBe(2);
        const epochAfter = (await manager.runtime(ref))?.leaseEpoch;
        expect(epochBefore).toBeTypeOf('number');
        expect(epochAfter).toBeGreaterThan(epochBefore!);
      });

      it('starts again when asked right after a stop has settled', async () => {
        await inRounds(owners(ROUNDS), async (owner) => {
          const ref = await fixture.createConversation(owner);
          await startAndWait(manager, ref);
          await manager.stop(ref);
          await waitForStatus(manager, ref, 'STOPPED');
          const stoppedAt = (await stored(ref)).length;

          await manager.ensureRunning(ref);

          await waitUntilReady(ref, stoppedAt);
          await waitForStatus(manager, ref, 'RUNNING');
        });
      });

      it('answers a message sent right after stop() resolved, starting the agent again', async () => {
        await inRounds(owners(ROUNDS), async (owner) => {
          const ref = await fixture.createConversation(owner);
          await startAndWait(manager, ref);

          await manager.stop(ref);
          const { event } = await manager.sendUserAction(ref, message('are you there?'));

          const events = await waitForAnswer(ref, event.id);
          expect(answersTo(events, event.id)).toHaveLength(1);
          await waitForStatus(manager, ref, 'RUNNING');
        });
      });

      it('evicts the least recently active conversation at the limit (evict_oldest)', async () => {
        const owner = newOwner();
        const [oldest, middle, newest] = await threeConversations(owner);
        await startAndWait(manager, oldest);
        await startAndWait(manager, middle);
        counts.since();

        await manager.ensureRunning(newest);
        // Counted once, by the manager that decided it, as the start returns.
        expect(counts.since()).toEqual({ evicted: 1, refused: 0 });

        const evictedEvents = await eventually(async () => {
          const events = await stored(oldest);
          const stop = stateChanges(events).at(-1);
          expect(stop).toMatchObject({ agentState: 'stopped', reason: TOO_MANY });
          return events;
        });
        expect(stateChanges(evictedEvents).at(-1)?.reason).toBe(
          'AGENT_ERROR$TOO_MANY_CONVERSATIONS',
        );
        await eventually(() =>
          expect(fixture.publishedStatuses(oldest.conversationId)).toContainEqual(
            expect.objectContaining({ status_update: true, type: 'error', id: TOO_MANY }),
          ),
        );
        await waitForStatus(manager, oldest, 'STOPPED');
        await waitUntilReady(newest);
        await waitForStatus(manager, newest, 'RUNNING');
        expect(await manager.status(middle)).toBe('RUNNING');
        expect((await manager.listRunning(owner.tenantId, owner.userId)).sort()).toEqual(
          [middle.conversationId, newest.conversationId].sort(),
        );
        expect(countOf(await stored(middle), 'stopped')).toBe(0);

        // A message resumes the evicted one, which now evicts the oldest of the others.
        const { event } = await manager.sendUserAction(oldest, message('back again'));
        await waitForAnswer(oldest, event.id);
        await eventually(async () =>
          expect(stateChanges(await stored(middle)).at(-1)).toMatchObject({
            agentState: 'stopped',
            reason: TOO_MANY,
          }),
        );
        await waitForStatus(manager, middle, 'STOPPED');
        expect((await manager.listRunning(owner.tenantId, owner.userId)).sort()).toEqual(
          [oldest.conversationId, newest.conversationId].sort(),
        );
        expect(counts.since()).toEqual({ evicted: 1, refused: 0 });
      });

      it('lists the running conversations of one user only', async () => {
        const owner = newOwner();
        const other = { tenantId: owner.tenantId, userId: 'bob' };
        const running = await fixture.createConversation(owner);
        const idle = await fixture.createConversation(owner);
        const othersRunning = await fixture.createConversation(other);
        await startAndWait(manager, running);
        await startAndWait(manager, othersRunning);

        expect(await manager.listRunning(owner.tenantId, owner.userId)).toEqual([
          running.conversationId,
        ]);
        expect(await manager.listRunning(other.tenantId, other.userId)).toEqual([
          othersRunning.conversationId,
        ]);
        expect(await manager.listRunning(uniqueName('tenant'), owner.userId)).toEqual([]);
        expect(await manager.status(idle)).toBe('STOPPED');

        await manager.stop(running);
        await eventually(async () =>
          expect(await manager.listRunning(owner.tenantId, owner.userId)).toEqual([]),
        );
        expect(await manager.listRunning(other.tenantId, other.userId)).toEqual([
          othersRunning.conversationId,
        ]);
      });

      it('counts attached connections per conversation', async () => {
        const owner = newOwner();
        const one = await fixture.createConversation(owner);
        const two = await fixture.createConversation(owner);
        const [a, b, c] = [randomUUID(), randomUUID(), randomUUID()];

        expect(await manager.connectionCount(one.conversationId)).toBe(0);
        await manager.attach({ ...one, connectionId: a });
        await manager.attach({ ...one, connectionId: b });
        await manager.attach({ ...two, connectionId: c });
        expect(await manager.connectionCount(one.conversationId)).toBe(2);
        expect(await manager.connectionCount(two.conversationId)).toBe(1);

        await manager.detach(a);
        expect(await manager.connectionCount(one.conversationId)).toBe(1);
        await manager.detach(a); // already gone: ignored
        await manager.detach(randomUUID()); // never attached: ignored
        expect(await manager.connectionCount(one.conversationId)).toBe(1);
        expect(await manager.connectionCount(two.conversationId)).toBe(1);

        await manager.detach(b);
        await manager.detach(c);
        expect(await manager.connectionCount(one.conversationId)).toBe(0);
        expect(await manager.connectionCount(two.conversationId)).toBe(0);
        // Attaching does not start the agent.
        expect(await manager.status(one)).toBe('STOPPED');
      });

      it('reports where a running conversation runs, and nothing once it stopped', async () => {
        const ref = await fixture.createConversation(newOwner());
        expect(await manager.runtime(ref)).toBeNull();
        await startAndWait(manager, ref);

        const runtime = await eventually(async () => {
          const current = await manager.runtime(ref);
          expect(current).not.toBeNull();
          return current!;
        });
        expect(fixture.agentHosts).toContain(runtime.workerId);
        const record = await fixture.storedConversation(ref);
        expect(runtime.leaseEpoch).toBeGreaterThan(0);
        expect(runtime).toEqual({ workerId: record?.leaseOwner, leaseEpoch: record?.leaseEpoch });

        await manager.stop(ref);
        await waitForStatus(manager, ref, 'STOPPED');
        expect(await manager.runtime(ref)).toBeNull();
      });

      it('pauses, resumes and stops on change_agent_state', async () => {
        const ref = await fixture.createConversation(newOwner());
        await startAndWait(manager, ref);

        const pause = await manager.sendUserAction(ref, changeAgentState('paused'));
        await eventually(async () =>
          expect(stateChanges(await stored(ref))).toContainEqual(
            expect.objectContaining({ agentState: 'paused', cause: pause.event.id }),
          ),
        );
        expect(await manager.status(ref)).toBe('RUNNING');

        // Queued behind the pause: answered only after the resume.
        const queued = await manager.sendUserAction(ref, message('while paused'));
        const resume = await manager.sendUserAction(ref, changeAgentState('running'));
        const events = await waitForAnswer(ref, queued.event.id);
        const resumed = stateChanges(events).find(
          (c) => c.cause === resume.event.id && c.agentState === 'awaiting_user_input',
        );
        expect(resumed).toBeDefined();
        const [answer] = answersTo(events, queued.event.id);
        expect(answer!.id).toBeGreaterThan(resumed!.id);
        expect(answersTo(events, queued.event.id)).toHaveLength(1);

        const stop = await manager.sendUserAction(ref, changeAgentState('stopped'));
        await eventually(async () =>
          expect(stateChanges(await stored(ref)).at(-1)).toMatchObject({
            agentState: 'stopped',
            cause: stop.event.id,
          }),
        );
        await waitForStatus(manager, ref, 'STOPPED');
        expect(await manager.listRunning(ref.tenantId, ref.userId)).toEqual([]);
        expect(await manager.runtime(ref)).toBeNull();
      });
    });

    describe('with reject', () => {
      let manager: ConversationManager;
      const counts = limitCounts();

      beforeAll(async () => {
        manager = await fixture.createManager({
          maxConcurrentConversations: LIMIT,
          concurrencyPolicy: 'reject',
          metrics: counts.metrics,
        });
      });

      it('refuses a start beyond the limit with CONCURRENCY_LIMIT_REACHED and stops nothing', async () => {
        const owner = newOwner();
        const [first, second, refused] = await threeConversations(owner);
        await startAndWait(manager, first);
        await startAndWait(manager, second);
        counts.since();

        const attempt = manager.ensureRunning(refused);
        await expect(attempt).rejects.toBeInstanceOf(ConcurrencyLimitError);
        await expect(attempt).rejects.toMatchObject({ code: 'CONCURRENCY_LIMIT_REACHED' });
        expect(counts.since()).toEqual({ evicted: 0, refused: 1 });

        expect(await manager.status(refused)).toBe('STOPPED');
        expect(await manager.status(first)).toBe('RUNNING');
        expect(await manager.status(second)).toBe('RUNNING');
        expect((await manager.listRunning(owner.tenantId, owner.userId)).sort()).toEqual(
          [first.conversationId, second.conversationId].sort(),
        );
        expect(countOf(await stored(first), 'stopped')).toBe(0);
        expect(countOf(await stored(refused), 'loading')).toBe(0);

        // A freed slot can be taken.
        await manager.stop(first);
        await waitForStatus(manager, first, 'STOPPED');
        await startAndWait(manager, refused);
        expect((await manager.listRunning(owner.tenantId, owner.userId)).sort()).toEqual(
          [second.conversationId, refused.conversationId].sort(),
        );
        expect(counts.since()).toEqual({ evicted: 0, refused: 0 });
      });

      it('refuses a message that would start a conversation at the limit, storing and publishing nothing', async () => {
        const owner = newOwner();
        const [first, second, stopped] = await threeConversations(owner);
        await startAndWait(manager, first);
        await startAndWait(manager, second);
        counts.since();

        for (let n = 0; n < 2; n += 1) {
          const attempt = manager.sendUserAction(stopped, message('later', 'key-later'));
          await expect(attempt).rejects.toBeInstanceOf(ConcurrencyLimitError);
        }
        expect(counts.since()).toEqual({ evicted: 0, refused: 2 });
        expect(await stored(stopped)).toEqual([]);
        expect(fixture.publishedEvents(stopped.conversationId)).toEqual([]);
        expect(await manager.status(stopped)).toBe('STOPPED');
        // What the caller read RUNNING just now takes no slot: it is stored at once.
        const busy = await manager.sendUserAction(first, message('more'), undefined, {
          status: 'RUNNING',
        });
        await waitForAnswer(first, busy.event.id);

        // A slot frees: the same key is stored once and answered once.
        await manager.stop(second);
        await fixture.untilUnheld(second);
        const sent = await manager.sendUserAction(stopped, message('later', 'key-later'));
        expect(sent.duplicate).toBe(false);
        const events = await waitForAnswer(stopped, sent.event.id);
        expect(events.filter((e) => e.source === 'user')).toEqual([sent.event]);
        expect(answersTo(events, sent.event.id)).toHaveLength(1);
        expect(fixture.publishedEvents(stopped.conversationId)[0]).toEqual(sent.event);
        expect((await manager.listRunning(owner.tenantId, owner.userId)).sort()).toEqual(
          [first.conversationId, stopped.conversationId].sort(),
        );
        expect(counts.since()).toEqual({ evicted: 0, refused: 0 });
      });

      it('gives back a slot claimed for a write that was not stored, and keeps one a start took over', async () => {
        const owner = newOwner();
        const [first, second, third] = await threeConversations(owner);
        await startAndWait(manager, first);
        counts.since();
        // Claimed, then not stored: given back.
        const claim = await manager.claimSlot(second);
        expect(claim?.taken).toBe(true);
        await expect(manager.claimSlot(third)).rejects.toBeInstanceOf(ConcurrencyLimitError);
        await claim?.release();
        // A message whose append fails (its conversation is not this incarnation) keeps none.
        const stale = { ...third, incarnation: randomUUID() };
        await expect(manager.sendUserAction(stale, message('lost'))).rejects.toMatchObject({
          code: 'NOT_FOUND',
        });
        expect(await manager.listRunning(owner.tenantId, owner.userId)).toEqual([
          first.conversationId,
        ]);
        // Claimed, then started: the start keeps the slot.
        const started = await manager.claimSlot(second);
        await startAndWait(manager, second);
        await started?.release();
        await expect(manager.ensureRunning(third)).rejects.toBeInstanceOf(ConcurrencyLimitError);
        // Held already: claiming it again takes nothing.
        expect((await manager.claimSlot(first))?.taken).toBe(false);
        expect((await manager.listRunning(owner.tenantId, owner.userId)).sort()).toEqual(
          [first.conversationId, second.conversationId].sort(),
        );
        // Refused: the claim for `third` and its start.
        expect(counts.since()).toEqual({ evicted: 0, refused: 2 });
      });
    });
  });
}

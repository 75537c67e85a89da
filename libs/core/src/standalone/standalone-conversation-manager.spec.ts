import { randomUUID } from 'node:crypto';
import { describe, expect, it, vi } from 'vitest';
import { isAction } from '@cs/protocol';
import type { UserAction } from '@cs/protocol';
import type { Agent } from '../agent.js';
import { refOf, type ConversationRef } from '../conversation.js';
import { ConcurrencyLimitError, UnavailableError } from '../errors.js';
import { NO_CLUSTER_METRICS, type ClusterMetrics } from '../ports/cluster-metrics.port.js';
import { readAgentStateChange } from '../session/agent-state-change.js';
import { TOO_MANY_CONVERSATIONS } from '../conversation-limits.js';
import {
  StandaloneConversationManager,
  type StandaloneConversationManagerOptions,
} from './standalone-conversation-manager.js';
import {
  GatedAgent,
  ManualClock,
  RecordingBroadcaster,
  ScriptedAgent,
  TestAgentFactory,
  echoTestAgent,
  messageText,
  say,
} from '../testing/index.js';
import { InMemoryConversationStore } from '../../../../test/fakes/in-memory-conversation-store.js';

const IDLE_MS = 60_000;
const CLEANUP_MS = 1_000;

function fixture(
  options: Partial<StandaloneConversationManagerOptions> = {},
  agents: Record<string, () => Agent> = {},
) {
  const clock = new ManualClock();
  const store = new InMemoryConversationStore({ clock });
  const broadcaster = new RecordingBroadcaster();
  const tenantId = `tenant-${randomUUID()}`;
  const factory = new TestAgentFactory({ echo: () => echoTestAgent(), ...agents });
  /** What was counted: leases taken, and the per-user limit's evictions and refusals. */
  const counted = { evictions: 0, rejections: 0, leases: 0 };
  const metrics: ClusterMetrics = {
    ...NO_CLUSTER_METRICS,
    leaseAcquired: () => {
      counted.leases += 1;
    },
    limitEviction: () => {
      counted.evictions += 1;
    },
    limitRejection: () => {
      counted.rejections += 1;
    },
  };
  const manager = new StandaloneConversationManager({
    store,
    broadcaster,
    agents: factory,
    clock,
    metrics,
    options: {
      maxConcurrentConversations: 3,
      concurrencyPolicy: 'evict_oldest',
      idleTimeoutMs: IDLE_MS,
      maxIterations: 10,
      ownerId: 'standalone-test',
      cleanupIntervalMs: CLEANUP_MS,
      catchUpIntervalMs: 500,
      ...options,
    },
  });

  async function conversation(userId = 'user-1', agent = 'echo'): Promise<ConversationRef> {
    const { conversation: created } = await store.createConversation({
      id: randomUUID(),
      tenantId,
      userId,
      appName: 'app',
      title: 'test',
      metadata: {},
      agent: { name: agent, config: {} },
      instructions: null,
    });
    return refOf(created);
  }

  const message = (content: string, client_event_id?: string): UserAction => ({
    action: 'message',
    args: { content, image_urls: [], file_urls: [] },
    ...(client_event_id === undefined ? {} : { client_event_id }),
  });

  const answers = (ref: ConversationRef) =>
    store
      .allEvents(ref.conversationId)
      .flatMap((e): [string, number | null][] =>
        e.source === 'agent' && isAction(e) ? [[messageText(e), e.cause ?? null]] : [],
      );

  const states = (ref: ConversationRef) =>
    store.allEvents(ref.conversationId).flatMap((e) => {
      const change = readAgentStateChange(e);
      return change ? [{ ...change, cause: e.cause ?? null }] : [];
    });

  const storedStatus = async (ref: ConversationRef) =>
    (await store.getConversation(ref.tenantId, ref.conversationId))?.status;

  return {
    clock,
    store,
    broadcaster,
    manager,
    counted,
    conversation,
    message,
    answers,
    states,
    storedStatus,
  };
}

describe(StandaloneConversationManager.name, () => {
  it('starts a conversation once for concurrent calls and reuses the running session', async () => {
    const f = fixture();
    const ref = await f.conversation();
    const statuses = await Promise.all([
      f.manager.ensureRunning(ref),
      f.manager.ensureRunning(ref),
      f.manager.ensureRunning(ref),
    ]);
    expect(statuses).toEqual(['RUNNING', 'RUNNING', 'RUNNING']);
    expect(await f.manager.ensureRunning(ref)).toBe('RUNNING');
    expect(f.states(ref).filter((s) => s.agentState === 'loading')).toHaveLength(1);
    expect(await f.manager.status(ref)).toBe('RUNNING');
    expect(await f.storedStatus(ref)).toBe('RUNNING');
    expect(await f.manager.listRunning(ref.tenantId, ref.userId)).toEqual([ref.conversationId]);
    const record = await f.store.getConversation(ref.tenantId, ref.conversationId);
    expect(await f.manager.runtime(ref)).toEqual({
      workerId: 'standalone-test',
      leaseEpoch: record?.leaseEpoch,
    });
    expect(record?.leaseOwner).toBe('standalone-test');
    await f.manager.shutdown();
  });

  it('stores a message, publishes it, starts the stopped conversation and answers it', async () => {
    const f = fixture();
    const ref = await f.conversation();
    expect(await f.manager.status(ref)).toBe('STOPPED');
    const { event, duplicate } = await f.manager.sendUserAction(ref, f.message('hi there'));
    expect(duplicate).toBe(false);
    expect(event).toMatchObject({ source: 'user', action: 'message', message: 'hi there' });
    expect(f.broadcaster.eventsOf(ref.conversationId)[0]).toEqual(event);
    expect(await f.manager.status(ref)).toBe('RUNNING');
    await vi.waitFor(() => expect(f.answers(ref)).toEqual([['echo: hi there', event.id]]));
    // Its lease taken once (`cs_lease_acquisitions_total`), as a worker counts it.
    expect(f.counted.leases).toBe(1);
    await f.manager.shutdown();
  });

  it('treats a repeated idempotency key as the same action: no second event, publish or answer', async () => {
    const f = fixture();
    const ref = await f.conversation();
    const first = await f.manager.sendUserAction(ref, f.message('once', 'key-1'));
    await vi.waitFor(() => expect(f.answers(ref)).toHaveLength(1));
    const repeat = await f.manager.sendUserAction(ref, f.message('once', 'key-1'));
    expect(repeat).toEqual({ event: first.event, duplicate: true });
    const viaHeader = await f.manager.sendUserAction(ref, f.message('once'), 'key-1');
    expect(viaHeader.duplicate).toBe(true);

    const userEvents = f.broadcaster
      .eventsOf(ref.conversationId)
      .filter((e) => e.source === 'user');
    expect(userEvents).toHaveLength(1);
    f.clock.advance(2_000);
    await new Promise((resolve) => setImmediate(resolve));
    expect(f.answers(ref)).toEqual([['echo: once', first.event.id]]);
    await f.manager.shutdown();
  });

  it('stops on a change_agent_state stop and records STOPPED', async () => {
    const f = fixture();
    const ref = await f.conversation();
    await f.manager.ensureRunning(ref);
    const stop = await f.manager.sendUserAction(ref, {
      action: 'change_agent_state',
      args: { agent_state: 'stopped' },
    });
    await vi.waitFor(async () => expect(await f.manager.status(ref)).toBe('STOPPED'));
    expect(await f.storedStatus(ref)).toBe('STOPPED');
    expect(f.states(ref).at(-1)).toEqual({ agentState: 'stopped', cause: stop.event.id });
    await f.manager.shutdown();
  });

  it('restores history and state after a stop and answers the next message once', async () => {
    const agent = () =>
      new ScriptedAgent(async function* (turn) {
        const count = typeof turn.state['count'] === 'number' ? turn.state['count'] + 1 : 1;
        const history = await turn.history.recent(100);
        const heard = history.filter((e) => e.source === 'user').length;
        yield { type: 'state', delta: { count } };
        yield say(`#${count} heard ${heard}: ${messageText(turn.trigger)}`);
      });
    const f = fixture({}, { counter: agent });
    const ref = await f.conversation('user-1', 'counter');
    const first = await f.manager.sendUserAction(ref, f.message('one'));
    await vi.waitFor(() => expect(f.answers(ref)).toHaveLength(1));

    expect(await f.manager.stop(ref)).toBe('STOPPED');
    expect(await f.storedStatus(ref)).toBe('STOPPED');
    expect(f.states(ref).at(-1)).toEqual({ agentState: 'stopped', cause: null });
    expect(await f.manager.runtime(ref)).toBeNull();

    const second = await f.manager.sendUserAction(ref, f.message('two'));
    await vi.waitFor(() => expect(f.answers(ref)).toHaveLength(2));
    expect(f.answers(ref)).toEqual([
      ['#1 heard 1: one', first.event.id],
      ['#2 heard 2: two', second.event.id],
    ]);
    const snapshot = await f.store.getSnapshot(ref.tenantId, ref.conversationId);
    expect(snapshot?.state).toEqual({ count: 2 });
    // The restarted session holds a newer lease.
    expect((await f.manager.runtime(ref))?.leaseEpoch).toBe(2);
    await f.manager.shutdown();
  });

  describe('per-user limit', () => {
    it('evict_oldest: N concurrent starts leave exactly the limit running; each evicted one is told why', async () => {
      const f = fixture({ maxConcurrentConversations: 2, concurrencyPolicy: 'evict_oldest' });
      const refs = await Promise.all([1, 2, 3, 4, 5].map(() => f.conversation('busy-user')));
      await Promise.all(refs.map((ref) => f.manager.ensureRunning(ref)));
      await vi.waitFor(async () =>
        expect(await f.manager.listRunning(refs[0]!.tenantId, 'busy-user')).toHaveLength(2),
      );

      const statuses = await Promise.all(refs.map((ref) => f.manager.status(ref)));
      expect(statuses.filter((s) => s === 'RUNNING')).toHaveLength(2);
      expect(statuses.filter((s) => s === 'STOPPED')).toHaveLength(3);
      for (const [index, ref] of refs.entries()) {
        if (statuses[index] !== 'STOPPED') continue;
        expect(f.states(ref).at(-1)).toMatchObject({
          agentState: 'stopped',
          reason: TOO_MANY_CONVERSATIONS,
        });
        expect(f.broadcaster.statusesOf(ref.conversationId).map((s) => s.id)).toEqual([
          TOO_MANY_CONVERSATIONS,
        ]);
        expect(await f.storedStatus(ref)).toBe('STOPPED');
      }
      // Each eviction counted once, where it was decided; nothing refused.
      expect(f.counted).toMatchObject({ evictions: 3, rejections: 0 });
      await f.manager.shutdown();
    });

    it('evict_oldest stops the least recently active conversation with the notice and the stored reason', async () => {
      const f = fixture({ maxConcurrentConversations: 2 });
      const a = await f.conversation();
      const b = await f.conversation();
      const c = await f.conversation();
      await f.manager.ensureRunning(a);
      f.clock.advance(1_000);
      await f.manager.ensureRunning(b);
      f.clock.advance(1_000);
      await f.manager.sendUserAction(a, f.message('still here')); // a is now the most recent
      await vi.waitFor(() => expect(f.answers(a)).toHaveLength(1));
      f.clock.advance(1_000);

      await f.manager.ensureRunning(c);
      expect(await f.manager.status(b)).toBe('STOPPED');
      expect(await f.manager.status(a)).toBe('RUNNING');
      expect(await f.manager.status(c)).toBe('RUNNING');
      expect(f.broadcaster.statusesOf(b.conversationId)).toEqual([
        expect.objectContaining({
          status_update: true,
          type: 'error',
          id: 'AGENT_ERROR$TOO_MANY_CONVERSATIONS',
        }),
      ]);
      const stopped = f.store.allEvents(b.conversationId).at(-1)!;
      expect(stopped).toMatchObject({
        observation: 'agent_state_changed',
        extras: { agent_state: 'stopped', reason: 'AGENT_ERROR$TOO_MANY_CONVERSATIONS' },
      });
      expect(f.broadcaster.eventsOf(b.conversationId).at(-1)).toEqual(stopped);
      expect(await f.storedStatus(b)).toBe('STOPPED');
      expect(f.counted).toMatchObject({ evictions: 1, rejections: 0 });
      await f.manager.shutdown();
    });

    it('reject: N concurrent starts leave exactly the limit running and the rest fail with CONCURRENCY_LIMIT_REACHED', async () => {
      const f = fixture({ maxConcurrentConversations: 2, concurrencyPolicy: 'reject' });
      const refs = await Promise.all([1, 2, 3, 4, 5].map(() => f.conversation('busy-user')));
      const results = await Promise.allSettled(refs.map((ref) => f.manager.ensureRunning(ref)));

      const fulfilled = results.filter((r) => r.status === 'fulfilled');
      const rejected = results.flatMap((r) =>
        r.status === 'rejected' ? [r.reason as unknown] : [],
      );
      expect(fulfilled.map((r) => r.value)).toEqual(['RUNNING', 'RUNNING']);
      expect(rejected).toHaveLength(3);
      for (const error of rejected) {
        expect(error).toBeInstanceOf(ConcurrencyLimitError);
        expect((error as ConcurrencyLimitError).code).toBe('CONCURRENCY_LIMIT_REACHED');
      }
      expect(await f.manager.listRunning(refs[0]!.tenantId, 'busy-user')).toHaveLength(2);
      // Each refusal counted once; nothing evicted.
      expect(f.counted).toMatchObject({ evictions: 0, rejections: 3 });
      await f.manager.shutdown();
    });

    it('reject: refuses a message that would start a conversation at the limit before storing or publishing it', async () => {
      const f = fixture({ maxConcurrentConversations: 1, concurrencyPolicy: 'reject' });
      const running = await f.conversation('full-user');
      const stopped = await f.conversation('full-user');
      await f.manager.ensureRunning(running);

      for (let n = 0; n < 2; n += 1) {
        const refused = f.manager.sendUserAction(stopped, f.message('wait', 'key-wait'));
        await expect(refused).rejects.toBeInstanceOf(ConcurrencyLimitError);
      }
      expect(f.store.allEvents(stopped.conversationId)).toEqual([]);
      expect(f.broadcaster.eventsOf(stopped.conversationId)).toEqual([]);
      expect(await f.manager.status(stopped)).toBe('STOPPED');
      expect(f.counted).toMatchObject({ evictions: 0, rejections: 2 });
      // A message to the running one takes nothing more.
      expect((await f.manager.sendUserAction(running, f.message('go on'))).duplicate).toBe(false);

      // A slot frees: the same key is stored once, starts the conversation and is answered once.
      await f.manager.stop(running);
      const stored = await f.manager.sendUserAction(stopped, f.message('wait', 'key-wait'));
      expect(stored.duplicate).toBe(false);
      expect(await f.manager.status(stopped)).toBe('RUNNING');
      await vi.waitFor(() => expect(f.answers(stopped)).toEqual([['echo: wait', stored.event.id]]));
      const repeat = await f.manager.sendUserAction(stopped, f.message('wait', 'key-wait'));
      expect(repeat).toEqual({ event: stored.event, duplicate: true });
      expect(f.store.allEvents(stopped.conversationId).filter((e) => e.source === 'user')).toEqual([
        stored.event,
      ]);
      // What was stored and started once a slot freed was not refused again.
      expect(f.counted).toMatchObject({ evictions: 0, rejections: 2 });
      await f.manager.shutdown();
    });

    it('reject: a slot claimed before storing counts against the limit until the start takes it over or it is released', async () => {
      const f = fixture({ maxConcurrentConversations: 1, concurrencyPolicy: 'reject' });
      const first = await f.conversation('claim-user');
      const second = await f.conversation('claim-user');

      const claim = await f.manager.claimSlot(first);
      expect(claim?.taken).toBe(true);
      await expect(f.manager.ensureRunning(second)).rejects.toBeInstanceOf(ConcurrencyLimitError);
      await expect(f.manager.claimSlot(second)).rejects.toBeInstanceOf(ConcurrencyLimitError);
      // Released: the slot is free again.
      await claim?.release();
      const other = await f.manager.claimSlot(second);
      await other?.release();
      // A message whose append then fails (deleted since) gives its slot back too.
      const stale = { ...second, incarnation: 'deleted-since' };
      await expect(f.manager.sendUserAction(stale, f.message('lost'))).rejects.toMatchObject({
        code: 'NOT_FOUND',
      });
      await (await f.manager.claimSlot(first))?.release();

      // Taken over by the start: releasing it afterwards gives nothing back.
      const started = await f.manager.claimSlot(first);
      expect(await f.manager.ensureRunning(first)).toBe('RUNNING');
      await started?.release();
      await expect(f.manager.ensureRunning(second)).rejects.toBeInstanceOf(ConcurrencyLimitError);
      // A running conversation holds its slot already: claiming it again is a no-op.
      const again = await f.manager.claimSlot(first);
      expect(again?.taken).toBe(false);
      await again?.release();
      expect(await f.manager.listRunning(first.tenantId, 'claim-user')).toEqual([
        first.conversationId,
      ]);
      // Refused: two starts of `second` and one claim for it.
      expect(f.counted).toMatchObject({ evictions: 0, rejections: 3 });
      await f.manager.shutdown();
    });

    it('evict_oldest: claims no slot before storing', async () => {
      const f = fixture({ maxConcurrentConversations: 1, concurrencyPolicy: 'evict_oldest' });
      expect(await f.manager.claimSlot(await f.conversation())).toBeNull();
      await f.manager.shutdown();
    });

    it('counts each user separately', async () => {
      const f = fixture({ maxConcurrentConversations: 1, concurrencyPolicy: 'reject' });
      const mine = await f.conversation('user-a');
      const theirs = await f.conversation('user-b');
      await f.manager.ensureRunning(mine);
      expect(await f.manager.ensureRunning(theirs)).toBe('RUNNING');
      expect(f.counted).toMatchObject({ evictions: 0, rejections: 0 });
      await f.manager.shutdown();
    });
  });

  describe('idle close', () => {
    it('closes a conversation with no client attached once idle, without storing anything', async () => {
      const f = fixture();
      const ref = await f.conversation();
      await f.manager.ensureRunning(ref);
      await f.manager.attach({ ...ref, connectionId: 'socket-1' });
      expect(await f.manager.connectionCount(ref.conversationId)).toBe(1);

      f.clock.advance(IDLE_MS + CLEANUP_MS * 2);
      await new Promise((resolve) => setImmediate(resolve));
      expect(await f.manager.status(ref)).toBe('RUNNING');

      await f.manager.detach('socket-1');
      const stored = f.store.allEvents(ref.conversationId).length;
      f.clock.advance(CLEANUP_MS);
      await vi.waitFor(async () => expect(await f.manager.status(ref)).toBe('STOPPED'));
      expect(await f.storedStatus(ref)).toBe('STOPPED');
      expect(f.store.allEvents(ref.conversationId)).toHaveLength(stored);
      await f.manager.shutdown();
    });

    it('keeps a conversation whose agent is mid-turn, and one with recent activity', async () => {
      const gated = new GatedAgent();
      const f = fixture({}, { gated: () => gated });
      const busy = await f.conversation('user-1', 'gated');
      const fresh = await f.conversation('user-1');
      await f.manager.sendUserAction(busy, f.message('slow'));
      await gated.entered;

      f.clock.advance(IDLE_MS - CLEANUP_MS);
      await f.manager.ensureRunning(fresh);
      f.clock.advance(CLEANUP_MS * 3);
      await new Promise((resolve) => setImmediate(resolve));
      expect(await f.manager.status(busy)).toBe('RUNNING');
      expect(await f.manager.status(fresh)).toBe('RUNNING');

      gated.release();
      await vi.waitFor(() => expect(f.answers(busy)).toHaveLength(1));
      f.clock.advance(IDLE_MS + CLEANUP_MS);
      await vi.waitFor(async () => expect(await f.manager.status(busy)).toBe('STOPPED'));
      await vi.waitFor(async () => expect(await f.manager.status(fresh)).toBe('STOPPED'));
      await f.manager.shutdown();
    });
  });

  it('records ERROR when the start fails and reports it to the caller', async () => {
    const f = fixture();
    const ref = await f.conversation('user-1', 'no-such-agent');
    await expect(f.manager.ensureRunning(ref)).rejects.toThrow('unknown agent: no-such-agent');
    expect(await f.manager.status(ref)).toBe('ERROR');
    expect(await f.storedStatus(ref)).toBe('ERROR');
    expect(await f.manager.listRunning(ref.tenantId, ref.userId)).toEqual([]);
    await f.manager.shutdown();
  });

  it('tells the other running conversations of the user that it stored user: keys: their next step sees them', async () => {
    const told = vi.fn();
    const f = fixture(
      { runtime: { onScopedStateChange: told } },
      {
        setter: () =>
          new ScriptedAgent(async function* (turn) {
            await Promise.resolve();
            yield { type: 'state', delta: { 'user:color': messageText(turn.trigger) } };
            yield say('noted');
          }),
        teller: () =>
          new ScriptedAgent(async function* (turn) {
            await Promise.resolve();
            yield say(`color: ${String(turn.state['user:color'])}`);
          }),
      },
    );
    const teller = await f.conversation('user-1', 'teller');
    const setter = await f.conversation('user-1', 'setter');
    await f.manager.sendUserAction(teller, f.message('one'));
    await vi.waitFor(() => expect(f.answers(teller)).toHaveLength(1));
    await f.manager.sendUserAction(setter, f.message('teal'));
    await vi.waitFor(() => expect(f.answers(setter)).toHaveLength(1));
    await f.manager.sendUserAction(teller, f.message('two'));
    await vi.waitFor(() => expect(f.answers(teller)).toHaveLength(2));

    expect(f.answers(teller).map(([text]) => text)).toEqual(['color: undefined', 'color: teal']);
    // Still the session that started first: it read the change, not a new snapshot.
    expect(f.states(teller).filter((s) => s.agentState === 'loading')).toHaveLength(1);
    // The deployment's own callback still hears of it.
    expect(told).toHaveBeenCalledWith(
      expect.objectContaining({ user: true, origin: setter.conversationId }),
    );
    await f.manager.shutdown();
  });

  it('shutdown closes every session, records STOPPED and refuses new work', async () => {
    const f = fixture();
    const a = await f.conversation();
    const b = await f.conversation();
    await f.manager.ensureRunning(a);
    await f.manager.ensureRunning(b);
    await f.manager.shutdown();
    expect(await f.storedStatus(a)).toBe('STOPPED');
    expect(await f.storedStatus(b)).toBe('STOPPED');
    expect(await f.manager.listRunning(a.tenantId, a.userId)).toEqual([]);
    expect(f.states(a).at(-1)?.agentState).toBe('awaiting_user_input'); // closed, not stopped
    await expect(f.manager.ensureRunning(a)).rejects.toBeInstanceOf(UnavailableError);
  });
});

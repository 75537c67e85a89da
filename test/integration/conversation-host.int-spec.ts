// ConversationHost on real Redis, BullMQ and Postgres: a conversation whose
// holders keep crashing is neither retried in a hot loop nor failed for good
// (it ends in `error`, and the next message starts it); a message whose
// wake-up was lost is still answered; a job handed out again to the worker
// still running it keeps its newer run's lock; a start does not start the
// conversation again after a stop ended its own run, after a stop that landed
// while a previous run was finishing, or after an eviction of its own job; a
// message sent while a stop was under way starts it again once stopped, one
// stored before the stop began does not; one stored as an idle session closed
// is answered.
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { AgentRegistry } from '@cs/agents';
import type { ClusterKeys } from '@cs/cluster';
import {
  ClusteredConversationManager,
  ConnectionRegistry,
  ConversationHost,
  ConversationInbox,
  ConversationJobs,
  ConversationStops,
  RedisRoomBroadcaster,
  ScopedStateChannel,
  TOO_MANY_FAILOVERS,
  UserConcurrencyLimiter,
  connected,
  leaseTiming,
  openRequestPublisher,
} from '@cs/cluster';
import type { ConversationRef, ConversationStore, EventDraft } from '@cs/core';
import type { ConversationStatus, StoredEvent } from '@cs/protocol';
import type { OpenedStore } from '@cs/store';
import { openScratchBackends, type ScratchBackends } from '../support/scratch-backends.js';
import { createEchoConversation, testRedisUrl, uniqueName } from '../support/services.js';
import { TcpProxy } from '../support/tcp-proxy.js';

const LEASE_TTL_MS = 2_000;
const MAX_FAILOVERS = 2;

/** Node 20 has no `Promise.withResolvers`. */
function withResolvers(): { promise: Promise<void>; resolve: () => void } {
  let resolve: () => void = () => undefined;
  const promise = new Promise<void>((done) => (resolve = done));
  return { promise, resolve };
}

/** A store call a test holds once: the first for its conversation (that `matches`) waits until `resume`. */
interface Hold<A = unknown> {
  conversationId: string;
  matches?: (args: A) => boolean;
  reached: () => void;
  resume: Promise<void>;
}

/** Holds this call when it is the one `hold` is for; `use` clears the hold first, so it holds once. */
async function pass<A>(
  hold: Hold<A> | null,
  conversationId: string,
  args: A,
  use: () => void,
): Promise<void> {
  if (!hold || hold.conversationId !== conversationId || !(hold.matches?.(args) ?? true)) return;
  use();
  hold.reached();
  await hold.resume;
}

/** A hold of one call for the conversation: `reached` when the call comes, it goes on at `resume`. */
function holdFor<A>(
  conversationId: string,
  reached: { resolve: () => void },
  resume: { promise: Promise<void> },
  matches?: (args: A) => boolean,
): Hold<A> {
  return {
    conversationId,
    reached: reached.resolve,
    resume: resume.promise,
    ...(matches ? { matches } : {}),
  };
}

describe(ConversationHost.name, () => {
  let backends: ScratchBackends;
  let opened: OpenedStore;
  let redis: Redis;
  let subscriber: Redis;
  let queueConnection: Redis;
  let host: ConversationHost;
  let jobs: ConversationJobs;
  let manager: ClusteredConversationManager;
  let managerDeps: ConstructorParameters<typeof ClusteredConversationManager>[0];
  let keys: ClusterKeys;
  /** Agent appends of the host that fail (as if Postgres went away) before writing. */
  let failingAgentAppends = 0;
  /** A conversation whose job the host, once it took it, holds before it listens to it. */
  let slowTake: Hold | null = null;
  /** A conversation whose host, about to append drafts that `matches`, holds before it writes them. */
  let slowAppend: Hold<readonly EventDraft[]> | null = null;
  /** A conversation whose run, once it let go of the conversation, holds before its job ends. */
  let slowFinish: Hold | null = null;
  /** A conversation whose host, once it read its events, holds before it goes on. */
  let slowLook: Hold | null = null;

  beforeAll(async () => {
    backends = await openScratchBackends('cs_host', 'host-test');
    ({ opened, redis, keys } = backends);
    subscriber = backends.connect('inbox');
    queueConnection = backends.connect('queue');
    const timing = leaseTiming(LEASE_TTL_MS);
    const limiter = new UserConcurrencyLimiter(redis, keys, {
      limit: 3,
      policy: 'evict_oldest',
      slotTtlMs: timing.slotTtlMs,
    });
    const broadcaster = new RedisRoomBroadcaster(redis, keys);
    const connections = new ConnectionRegistry(redis, keys, 'gateway-test', 15_000);
    const store = opened.store;
    const flakyStore: ConversationStore = Object.assign(Object.create(store) as ConversationStore, {
      append: async (...args: Parameters<ConversationStore['append']>) => {
        if (failingAgentAppends > 0 && args[2].some((draft) => draft.source === 'agent')) {
          failingAgentAppends -= 1;
          throw new Error('connection terminated');
        }
        await pass(slowAppend, args[1], args[2], () => (slowAppend = null));
        return store.append(...args);
      },
      // A run's first read, in holdJob: between taking the job and listening to the conversation.
      getConversation: async (...args: Parameters<ConversationStore['getConversation']>) => {
        await pass(slowTake, args[1], undefined, () => (slowTake = null));
        return store.getConversation(...args);
      },
      readEvents: async (...args: Parameters<ConversationStore['readEvents']>) => {
        const events = await store.readEvents(...args);
        await pass(slowLook, args[1], undefined, () => (slowLook = null));
        return events;
      },
      // A run's last step, in holdJob: after it stopped listening, before its job completes.
      releaseLease: async (...args: Parameters<ConversationStore['releaseLease']>) => {
        await pass(slowFinish, args[1], undefined, () => (slowFinish = null));
        return store.releaseLease(...args);
      },
    });
    host = new ConversationHost({
      store: flakyStore,
      agents: new AgentRegistry(),
      broadcaster,
      inbox: new ConversationInbox(redis, subscriber, keys),
      scopedState: new ScopedStateChannel(redis, subscriber, keys),
      limiter,
      connections,
      redis,
      keys,
      bullConnection: queueConnection,
      options: {
        workerId: 'host-test-worker',
        concurrency: 10,
        timing,
        idleTimeoutMs: 3_600_000,
        maxIterations: 10,
        maxFailovers: MAX_FAILOVERS,
        failoverWindowMs: 60_000,
      },
      log: () => undefined,
    });
    host.start();
    jobs = new ConversationJobs(redis, keys);
    managerDeps = {
      store: opened.store,
      broadcaster,
      jobs,
      inbox: new ConversationInbox(redis, null, keys),
      stops: new ConversationStops(redis, keys),
      limiter,
      connections,
      limit: 3,
      stopTimeoutMs: LEASE_TTL_MS + 2_000,
    };
    manager = new ClusteredConversationManager(managerDeps);
  });

  afterAll(async () => {
    await host?.drain();
    await jobs?.close();
    await backends?.close();
  });

  /** A new echo conversation, of a user of a tenant of its own, not started. */
  function echoConversation(title: string): Promise<ConversationRef> {
    return createEchoConversation(
      opened.store,
      { tenantId: uniqueName('tenant'), userId: 'user' },
      title,
    );
  }

  /** A new echo conversation, started and held by the host. */
  async function hostedConversation(title: string): Promise<ConversationRef> {
    const ref = await echoConversation(title);
    await manager.ensureRunning(ref);
    await untilHosted(ref);
    return ref;
  }

  /** Waits until the host holds the conversation. */
  async function untilHosted(ref: ConversationRef): Promise<void> {
    await vi.waitFor(() => expect(host.conversations).toContain(ref.conversationId), {
      timeout: 10_000,
      interval: 50,
    });
  }

  /** The open session of a conversation the host holds (the heartbeat closes it once idle). */
  function hostedSession(ref: ConversationRef): { close(): Promise<void> } {
    const { hosted } = host as unknown as {
      hosted: Map<string, { session: { close(): Promise<void> } | null }>;
    };
    const session = hosted.get(ref.conversationId)?.session;
    if (!session) throw new Error(`${ref.conversationId} has no session here`);
    return session;
  }

  /**
   * Closes the conversation's session as the heartbeat closes an idle one;
   * resolves once its run has looked for a message left to answer (before
   * it marks the conversation STOPPED), holding it there until `goOn`.
   */
  async function closeHeldAfterLook(ref: ConversationRef): Promise<{ goOn: () => void }> {
    const looked = withResolvers();
    const goOn = withResolvers();
    slowLook = holdFor(ref.conversationId, looked, goOn);
    await hostedSession(ref).close();
    await looked.promise;
    expect(slowLook).toBeNull();
    return { goOn: goOn.resolve };
  }

  /** A gateway whose wake-ups fail after it stored the action (a Redis master failing over). */
  function gatewayWhoseWakeUpsFail(): ClusteredConversationManager {
    const failingInbox = Object.assign(Object.create(managerDeps.inbox) as ConversationInbox, {
      send: () => Promise.reject(new Error('MOVED 1234 127.0.0.1:7001')),
    });
    return new ClusteredConversationManager({ ...managerDeps, inbox: failingInbox });
  }

  /**
   * Waits until the stored status is `status`. A started session's loop may
   * answer a stored message before the run has written RUNNING, so an answer
   * alone does not tell that the status is written yet.
   */
  async function untilStatus(ref: ConversationRef, status: ConversationStatus): Promise<void> {
    await vi.waitFor(
      async () =>
        expect((await opened.store.getConversation(ref.tenantId, ref.conversationId))?.status).toBe(
          status,
        ),
      { timeout: 10_000, interval: 50 },
    );
  }

  /** Waits until the conversation's agent awaits user input (restored, or done answering). */
  async function untilAwaitingInput(ref: ConversationRef): Promise<void> {
    await vi.waitFor(
      async () =>
        expect(
          (await opened.store.getConversation(ref.tenantId, ref.conversationId))?.agentState,
        ).toBe('awaiting_user_input'),
      { timeout: 10_000, interval: 20 },
    );
  }

  /** Sends a user message through the manager (a gateway); returns the stored event's id. */
  async function userSays(ref: ConversationRef, content: string): Promise<number> {
    const sent = await manager.sendUserAction(ref, {
      action: 'message',
      args: { content, image_urls: [], file_urls: [] },
    });
    return sent.event.id;
  }

  /** Waits until the agent has answered the event `cause`; returns its answers. */
  async function answersTo(ref: ConversationRef, cause: number): Promise<StoredEvent[]> {
    let answers: StoredEvent[] = [];
    await vi.waitFor(
      async () => {
        const all = await opened.store.readEvents(ref.tenantId, ref.conversationId, { limit: 100 });
        answers = all.filter((e) => e.source === 'agent' && e.cause === cause);
        expect(answers.length).toBeGreaterThan(0);
      },
      { timeout: 10_000, interval: 50 },
    );
    return answers;
  }

  it('does not start a conversation again that a stop ended while its start watched its job', async () => {
    const ref = await echoConversation('stopped while starting');
    const taken = withResolvers();
    const resume = withResolvers();
    const stopped = withResolvers();
    slowTake = holdFor(ref.conversationId, taken, resume);
    // The start's own look at the job: its first look finds the job just taken by the
    // host, not listened to yet (as a finishing run would look); the next comes only
    // after the whole run (as from a busy gateway): the run starts and is stopped in between.
    let looks = 0;
    const watchedJobs = Object.assign(Object.create(jobs) as ConversationJobs, {
      state: async (conversationId: string) => {
        looks += 1;
        if (looks === 1) await taken.promise;
        if (looks === 2) {
          resume.resolve();
          await stopped.promise;
        }
        return jobs.state(conversationId);
      },
    });
    const starter = new ClusteredConversationManager({ ...managerDeps, jobs: watchedJobs });

    const starting = starter.ensureRunning(ref);
    await untilAwaitingInput(ref);
    expect(await manager.stop(ref)).toBe('STOPPED');
    stopped.resolve();
    await starting;

    // The stop wins: nothing asked for the conversation after it.
    expect(looks).toBeGreaterThanOrEqual(2);
    expect(await jobs.state(ref.conversationId)).toBeNull();
    const record = await opened.store.getConversation(ref.tenantId, ref.conversationId);
    expect(record).toMatchObject({ status: 'STOPPED', agentState: 'stopped' });
    const events = await opened.store.readEvents(ref.tenantId, ref.conversationId, { limit: 100 });
    expect(events.map((e) => ('extras' in e ? e.extras.agent_state : e.source))).toEqual([
      'loading',
      'awaiting_user_input',
      'stopped',
    ]);
  });

  /** A manager whose looks at the conversation's job first run `beforeLook` (with the look's number). */
  function watchingManager(
    beforeLook: (look: number) => Promise<void>,
  ): ClusteredConversationManager {
    let looks = 0;
    const watchedJobs = Object.assign(Object.create(jobs) as ConversationJobs, {
      state: async (conversationId: string) => {
        looks += 1;
        await beforeLook(looks);
        return jobs.state(conversationId);
      },
    });
    return new ClusteredConversationManager({ ...managerDeps, jobs: watchedJobs });
  }

  it('does not start a conversation again that a stop ended while a previous run was finishing', async () => {
    const ref = await hostedConversation('stopped while finishing');
    await untilAwaitingInput(ref);
    const finishing = withResolvers();
    const finish = withResolvers();
    slowFinish = holdFor(ref.conversationId, finishing, finish);
    // The previous run ends (a stop its holder heard) and lets go, but its job stays active.
    await managerDeps.inbox.send(ref.conversationId, { type: 'stop' });
    await finishing.promise;

    // The start finds that finishing run (first look), then looks again only after the stop.
    const parked = withResolvers();
    const stopped = withResolvers();
    const starter = watchingManager(async (look) => {
      if (look !== 2) return;
      parked.resolve();
      await stopped.promise;
    });
    const starting = starter.ensureRunning(ref);
    await parked.promise;
    // The user's stop lands while the previous run is still finishing.
    const stopLooked = withResolvers();
    const stopper = watchingManager(async () => stopLooked.resolve());
    const stopping = stopper.stop(ref);
    await stopLooked.promise;
    expect(await jobs.state(ref.conversationId)).toBe('active');
    finish.resolve();
    expect(await stopping).toBe('STOPPED');
    stopped.resolve();
    await starting;

    // The stop wins: the start's look at the gone run does not start it again.
    expect(await jobs.state(ref.conversationId)).toBeNull();
    expect(await opened.store.getConversation(ref.tenantId, ref.conversationId)).toMatchObject({
      status: 'STOPPED',
      agentState: 'stopped',
    });
    expect(await manager.listRunning(ref.tenantId, ref.userId)).toEqual([]);
    const events = await opened.store.readEvents(ref.tenantId, ref.conversationId, { limit: 100 });
    expect(events.map((e) => ('extras' in e ? e.extras.agent_state : e.source))).toEqual([
      'loading',
      'awaiting_user_input',
      'stopped',
    ]);
  });

  /** Whether `drafts` hold the agent state change to `state`. */
  function changesStateTo(drafts: readonly EventDraft[], state: string): boolean {
    return drafts.some(
      (draft) => 'extras' in draft.body && draft.body.extras['agent_state'] === state,
    );
  }

  it('answers a message sent while a stop was under way, starting the conversation again once stopped', async () => {
    const ref = await hostedConversation('messaged while stopping');
    await untilAwaitingInput(ref);
    // The holder, stopping, holds before it stores `stopped`: it still listens.
    const stopping = withResolvers();
    const stop = withResolvers();
    slowAppend = holdFor(ref.conversationId, stopping, stop, (drafts) =>
      changesStateTo(drafts, 'stopped'),
    );
    const stopped = manager.stop(ref);
    await stopping.promise;
    expect(await managerDeps.inbox.holders(ref.conversationId)).toBe(1);
    const sent = await userSays(ref, 'sent while stopping');
    stop.resolve();

    // The stop ends the run it asked to end, then the message starts the conversation again.
    expect(['STARTING', 'RUNNING']).toContain(await stopped);
    const [answer] = await answersTo(ref, sent);
    expect(answer).toMatchObject({ source: 'agent', action: 'message' });
    const events = await opened.store.readEvents(ref.tenantId, ref.conversationId, { limit: 100 });
    // Unanswered by the run that stopped; answered by the next one.
    const kinds = events.map((e) => ('extras' in e ? e.extras.agent_state : e.source));
    expect(kinds.slice(0, 5)).toEqual([
      'loading',
      'awaiting_user_input',
      'user',
      'stopped',
      'loading',
    ]);
    expect(answer?.id).toBeGreaterThan(events[4]?.id ?? Infinity);
    expect(await manager.stop(ref)).toBe('STOPPED');
  });

  it('answers a message stored as its idle session closed, after the run looked for one to answer', async () => {
    const ref = await hostedConversation('messaged while closing');
    await untilAwaitingInput(ref);
    // The run, looking for a message left to answer before it lets go, holds once it has looked.
    const { goOn } = await closeHeldAfterLook(ref);

    // A gateway stores a message now: a run that still listens hears its
    // wake-up (and would answer nothing), one that does not gets it started
    // again, once it has let go (within the start's wait for a finishing run).
    const sending = userSays(ref, 'sent as it closed');
    await Promise.race([sending, new Promise((resolve) => setTimeout(resolve, 300))]);
    goOn();
    const sent = await sending;
    const [answer] = await answersTo(ref, sent);
    expect(answer).toMatchObject({ source: 'agent', action: 'message' });
    expect(await manager.stop(ref)).toBe('STOPPED');
  });

  it('answers a message stored as its idle session closed, after the run looked, by a gateway that read it RUNNING and whose wake-up failed', async () => {
    const ref = await hostedConversation('messaged while closing, wake-up lost');
    await untilAwaitingInput(ref);
    // The run has looked for a message left to answer (none) and holds there,
    // before it marks the conversation STOPPED.
    const { goOn } = await closeHeldAfterLook(ref);

    // A gateway that read the conversation RUNNING stores a message, and its
    // wake-up fails: the request is answered as delivered, the conversation
    // being RUNNING still, and starts nothing.
    const sent = await gatewayWhoseWakeUpsFail().sendUserAction(
      ref,
      { action: 'message', args: { content: 'wake-up lost', image_urls: [], file_urls: [] } },
      undefined,
      { status: 'RUNNING' },
    );
    goOn();
    // The run marks it STOPPED, looks again, and answers it.
    const [answer] = await answersTo(ref, sent.event.id);
    expect(answer).toMatchObject({ source: 'agent', action: 'message' });
    await untilStatus(ref, 'RUNNING');
    expect(await manager.stop(ref)).toBe('STOPPED');
  });

  it('fails, rather than takes for delivered, a message whose wake-up failed once the run it was read RUNNING under had ended; its repeat starts it', async () => {
    const ref = await hostedConversation('stopped since it was read');
    await untilAwaitingInput(ref);
    // The session closes (idle) and the run ends, after a gateway read RUNNING.
    await hostedSession(ref).close();
    await untilStatus(ref, 'STOPPED');
    await vi.waitFor(() => expect(host.conversations).not.toContain(ref.conversationId), {
      timeout: 10_000,
      interval: 50,
    });
    const action = {
      action: 'message' as const,
      args: { content: 'after the run ended', image_urls: [], file_urls: [] },
    };
    // Nobody would answer it: the request fails, as when Redis fails before the write.
    await expect(
      gatewayWhoseWakeUpsFail().sendUserAction(ref, action, 'stopped-since-read', {
        status: 'RUNNING',
      }),
    ).rejects.toThrow(/MOVED/);
    // Its client sends it again: the same event, and this time the conversation starts.
    const again = await manager.sendUserAction(ref, action, 'stopped-since-read');
    expect(again.duplicate).toBe(true);
    const [answer] = await answersTo(ref, again.event.id);
    expect(answer).toMatchObject({ source: 'agent', action: 'message' });
    expect(await manager.stop(ref)).toBe('STOPPED');
  });

  it('answers a message stored as its idle run ended, though that run took longer to go than a start waits', async () => {
    const ref = await hostedConversation('messaged as a slow run ends');
    await untilAwaitingInput(ref);
    // The session closes (idle); its run finds no message to answer, marks the
    // conversation STOPPED, finds none again, lets go of the slot, and holds
    // before its last step (its job still active).
    const finishing = withResolvers();
    const finish = withResolvers();
    slowFinish = holdFor(ref.conversationId, finishing, finish);
    await hostedSession(ref).close();
    await finishing.promise;

    // A gateway stores a message: nobody listens, its start finds the run's
    // job still active and waits for it, past FINISHING_RUN_WAIT_MS, then answers.
    const sent = await userSays(ref, 'sent as the run ended');
    expect(await jobs.state(ref.conversationId)).toBe('active');
    // The run goes on: its job gone, the start still watching starts the conversation.
    finish.resolve();
    const [answer] = await answersTo(ref, sent);
    expect(answer).toMatchObject({ source: 'agent', action: 'message' });
    expect(await manager.stop(ref)).toBe('STOPPED');
  });

  it('does not answer after a stop a message stored before the stop began', async () => {
    const ref = await hostedConversation('messaged before the stop');
    // The turn of the first message holds before it stores its answer, with a second queued behind.
    const answering = withResolvers();
    const answer = withResolvers();
    slowAppend = holdFor(ref.conversationId, answering, answer, (drafts) =>
      drafts.some((draft) => draft.answers !== undefined),
    );
    const cut = await userSays(ref, 'answered as the stop lands');
    await answering.promise;
    const queued = await userSays(ref, 'queued before the stop');
    // The stop begins (its first look at the job comes once the holder was told), then the turn ends.
    const stopLooked = withResolvers();
    const stopper = watchingManager(async () => stopLooked.resolve());
    const stopped = stopper.stop(ref);
    await stopLooked.promise;
    answer.resolve();

    // The stop wins over the queued message: nothing starts the conversation again.
    expect(await stopped).toBe('STOPPED');
    expect(await jobs.state(ref.conversationId)).toBeNull();
    expect(await manager.listRunning(ref.tenantId, ref.userId)).toEqual([]);
    const events = await opened.store.readEvents(ref.tenantId, ref.conversationId, { limit: 100 });
    expect(events.filter((e) => e.source === 'agent').map((e) => e.cause)).toEqual([cut]);
    expect(events.some((e) => e.cause === queued)).toBe(false);
    expect(await opened.store.getConversation(ref.tenantId, ref.conversationId)).toMatchObject({
      status: 'STOPPED',
      agentState: 'stopped',
    });
  });

  it('does not start a conversation again whose job an eviction cancelled before it was held', async () => {
    const owner = { tenantId: uniqueName('tenant'), userId: 'user' };
    const ref = await createEchoConversation(opened.store, owner, 'evicted while taken');
    const taken = withResolvers();
    const resume = withResolvers();
    const evicted = withResolvers();
    const gone = withResolvers();
    slowTake = holdFor(ref.conversationId, taken, resume);
    // The start's first look finds its job just taken, not listened to yet; its next
    // waits for the eviction and for the job to go (its holder finds its slot gone).
    const starter = watchingManager(async (look) => {
      if (look === 1) await taken.promise;
      if (look !== 2) return;
      await evicted.promise;
      resume.resolve();
      await gone.promise;
    });
    const starting = starter.ensureRunning(ref);
    await taken.promise;

    // Three newer starts of the same user (limit 3): the third evicts the oldest, this one.
    const others = [];
    for (const title of ['newer 1', 'newer 2', 'newer 3']) {
      const other = await createEchoConversation(opened.store, owner, title);
      await manager.ensureRunning(other);
      others.push(other.conversationId);
    }
    evicted.resolve();
    await vi.waitFor(async () => expect(await jobs.state(ref.conversationId)).toBeNull(), {
      timeout: 10_000,
      interval: 20,
    });
    gone.resolve();
    await starting;

    // The eviction wins: the start does not take a slot back (evicting another) nor run.
    expect(await jobs.state(ref.conversationId)).toBeNull();
    expect((await opened.store.getConversation(ref.tenantId, ref.conversationId))?.status).toBe(
      'STOPPED',
    );
    expect((await manager.listRunning(ref.tenantId, ref.userId)).sort()).toEqual(others.sort());
    const events = await opened.store.readEvents(ref.tenantId, ref.conversationId, { limit: 100 });
    expect(events.map((e) => ('extras' in e ? e.extras : e.source))).toEqual([
      { agent_state: 'stopped', reason: 'AGENT_ERROR$TOO_MANY_CONVERSATIONS' },
    ]);
  });

  it('ends a conversation in error when its holders keep crashing on the same message, then starts it with the next one', async () => {
    const ref = await echoConversation('crashy');
    // A message its holders died on, MAX_FAILOVERS times already; the last
    // holder left its lease behind without handing it back.
    const [poison] = await opened.store.append(ref.tenantId, ref.conversationId, [
      { source: 'user', body: { action: 'message', args: { content: 'boom' }, message: 'boom' } },
    ]);
    const failovers = keys.conversationFailovers(ref.conversationId);
    for (let n = 0; n < MAX_FAILOVERS; n++)
      await redis.zadd(failovers, Date.now(), `message:${poison!.event.id}|crash-${n}`);
    await opened.store.acquireLease(ref.tenantId, ref.conversationId, 'crashed-worker');

    await manager.ensureRunning(ref);
    await vi.waitFor(
      async () =>
        expect((await opened.store.getConversation(ref.tenantId, ref.conversationId))?.status).toBe(
          'ERROR',
        ),
      { timeout: 10_000, interval: 50 },
    );
    const events = await opened.store.readEvents(ref.tenantId, ref.conversationId, { limit: 100 });
    expect(events.map((e) => ('extras' in e ? e.extras : e.source))).toEqual([
      'user',
      { agent_state: 'error', reason: TOO_MANY_FAILOVERS },
    ]);
    await vi.waitFor(async () => expect(await jobs.state(ref.conversationId)).toBeNull());
    expect(await manager.listRunning(ref.tenantId, ref.userId)).toEqual([]);
    expect(host.conversations).not.toContain(ref.conversationId);

    // Not failed for good: a message starts it again (a clean start, no failover).
    const sent = await userSays(ref, 'are you back?');
    await answersTo(ref, sent);
    await untilStatus(ref, 'RUNNING');
  });

  it('does not count crashes of holders that were not working on the conversation', async () => {
    const ref = await echoConversation('unlucky');
    // Many holders died, each on a message the next one answered, or while it sat idle.
    const failovers = keys.conversationFailovers(ref.conversationId);
    for (let n = 0; n < 3 * MAX_FAILOVERS; n++)
      await redis.zadd(failovers, Date.now(), `message:${n}|crash-${n}`);
    await opened.store.acquireLease(ref.tenantId, ref.conversationId, 'crashed-worker');

    await manager.ensureRunning(ref);
    await untilHosted(ref);
    const sent = await userSays(ref, 'fine?');
    expect(await answersTo(ref, sent)).toHaveLength(1);
    await untilStatus(ref, 'RUNNING');
  });

  it('keeps renewing the newer run when a stalled job is handed to the worker still running it', async () => {
    const ref = await hostedConversation('stalled');
    const lock = `${keys.bullPrefix}:{conversations}:conversation-${ref.conversationId}:lock`;
    const leaseEpoch = async () =>
      (await opened.store.getConversation(ref.tenantId, ref.conversationId))!.leaseEpoch;
    const firstToken = await redis.get(lock);
    expect(firstToken).toBeTruthy();
    const firstEpoch = await leaseEpoch();

    // As when this process was paused past its lock: the lock lapses, and the stalled
    // check hands the job out again, to this worker, while its first run goes on.
    await redis.del(lock);
    let secondToken: string | null = null;
    await vi.waitFor(
      async () => {
        secondToken = await redis.get(lock);
        expect(secondToken).toBeTruthy();
        expect(secondToken).not.toBe(firstToken);
        expect(await leaseEpoch()).toBe(firstEpoch + 1);
        expect(host.conversations).toContain(ref.conversationId);
      },
      { timeout: 10_000, interval: 50 },
    );

    // The first run is over; the second's lock outlives several lock durations, so the
    // job is not handed out again (each time a failover, until too_many_failovers):
    // it is renewed, under the same token, until it has lived three lock durations
    // on renewals alone (one missed renewal too many and it would have lapsed).
    const { lockDuration, lockRenewTime } = leaseTiming(LEASE_TTL_MS);
    let renewals = 0;
    let lastTtl = await redis.pttl(lock);
    await vi.waitFor(
      async () => {
        expect(await redis.get(lock)).toBe(secondToken);
        const ttl = await redis.pttl(lock);
        if (ttl > lastTtl) renewals += 1;
        lastTtl = ttl;
        expect(renewals * lockRenewTime).toBeGreaterThanOrEqual(3 * lockDuration);
      },
      { timeout: 30_000, interval: 50 },
    );
    expect(await redis.get(lock)).toBe(secondToken);
    expect(await leaseEpoch()).toBe(firstEpoch + 1);
    expect(await jobs.state(ref.conversationId)).toBe('active');
    expect(host.conversations).toContain(ref.conversationId);
    const sent = await userSays(ref, 'still you?');
    expect(await answersTo(ref, sent)).toHaveLength(1);
  });

  it('answers a message whose wake-up was lost, found by its periodic catch-up', async () => {
    const ref = await hostedConversation('quiet');
    // Stored without a wake-up, as when Redis dropped it.
    const [stored] = await opened.store.append(ref.tenantId, ref.conversationId, [
      {
        source: 'user',
        body: { action: 'message', args: { content: 'anyone?' }, message: 'anyone?' },
      },
    ]);
    await answersTo(ref, stored!.event.id);
  });

  it('acknowledges a message to a running conversation whose wake-up Redis never answers, and its holder answers it from its catch-up', async () => {
    const ref = await hostedConversation('wake-up hangs');
    await untilStatus(ref, 'RUNNING');
    // The gateway's publisher, a request connection as in the gateway app, to
    // a Redis whose answers stop coming (a master that hangs or died).
    const proxy = await TcpProxy.start([Number(new URL(testRedisUrl()).port || 6379)]);
    const publisher = openRequestPublisher(`redis://127.0.0.1:${proxy.port}`, 'hanging-publish');
    try {
      await connected(publisher);
      proxy.mutedDownstream = true;
      const gateway = new ClusteredConversationManager({
        ...managerDeps,
        inbox: new ConversationInbox(publisher, null, keys),
      });
      const sent = await gateway.sendUserAction(
        ref,
        { action: 'message', args: { content: 'are you there?', image_urls: [], file_urls: [] } },
        undefined,
        { status: 'RUNNING' },
      );
      const [answer] = await answersTo(ref, sent.event.id);
      expect(answer).toMatchObject({ source: 'agent', action: 'message' });
      expect(await manager.stop(ref)).toBe('STOPPED');
    } finally {
      publisher.disconnect();
      await proxy.close();
    }
  });

  it('tries a failed write again from its periodic catch-up, with no new event to wake it', async () => {
    const ref = await hostedConversation('flaky');
    failingAgentAppends = 1;
    const sent = await userSays(ref, 'still there?');
    expect(await answersTo(ref, sent)).toHaveLength(1);
    expect(failingAgentAppends).toBe(0);
  });

  it('takes a free slot back when Redis lost the slot of a conversation it holds', async () => {
    const ref = await hostedConversation('slot lost');
    // As after a Redis restart without persistence: the user's slots are gone.
    await redis.del(keys.userRunning(ref.tenantId, ref.userId));
    await redis.del(keys.userSlotExpiry(ref.tenantId, ref.userId));

    await vi.waitFor(
      async () =>
        expect(await manager.listRunning(ref.tenantId, ref.userId)).toEqual([ref.conversationId]),
      {
        timeout: 10_000,
        interval: 50,
      },
    );
    const sent = await userSays(ref, 'still running?');
    expect(await answersTo(ref, sent)).toHaveLength(1);
  });

  it('stops a conversation whose slot was taken while its user has none free, as if evicted', async () => {
    const ref = await hostedConversation('slot taken');
    // Its slot went to others and the user's limit (3) is full.
    const running = keys.userRunning(ref.tenantId, ref.userId);
    const expiry = keys.userSlotExpiry(ref.tenantId, ref.userId);
    await redis.zrem(running, ref.conversationId);
    for (const other of ['other-1', 'other-2', 'other-3']) {
      await redis.zadd(running, Date.now(), other);
      await redis.hset(expiry, other, String(Date.now() + 60_000));
    }

    await vi.waitFor(() => expect(host.conversations).not.toContain(ref.conversationId), {
      timeout: 10_000,
      interval: 50,
    });
    const events = await opened.store.readEvents(ref.tenantId, ref.conversationId, { limit: 100 });
    expect(events.at(-1)).toMatchObject({
      observation: 'agent_state_changed',
      extras: { agent_state: 'stopped', reason: 'AGENT_ERROR$TOO_MANY_CONVERSATIONS' },
    });
    expect(await redis.zrange(running, '0', '-1')).toEqual(['other-1', 'other-2', 'other-3']);
  });

  // Last: it drains the host.
  it('hands back a conversation whose run was taking its job as the drain began, and the drain ends', async () => {
    const ref = await echoConversation('taken as the drain began');
    // The run holds right after it took the job, before it counts among the hosted.
    const taking = withResolvers();
    const take = withResolvers();
    slowTake = holdFor(ref.conversationId, taking, take);
    const starting = manager.ensureRunning(ref);
    await taking.promise;
    const drained = host.drain();
    take.resolve();

    // Its session starts and hands the conversation back at once: nothing keeps the drain waiting.
    await drained;
    await starting;
    expect(await jobs.state(ref.conversationId)).not.toBeNull();
    expect(await opened.store.getConversation(ref.tenantId, ref.conversationId)).toMatchObject({
      leaseOwner: null,
    });
  });
});

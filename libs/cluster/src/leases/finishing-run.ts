// A start that finds the conversation's previous run finishing (its session
// ended, its job not yet gone) waits for that run to go, then starts again.
import { setTimeout as sleep } from 'node:timers/promises';
import { STARTABLE_STATUSES, type ConversationRef, type ConversationStore } from '@cs/core';
import type { ConversationInbox } from './conversation-inbox.js';
import type { ConversationJobs } from './conversation-jobs.js';
import type { ConversationStops } from './conversation-stops.js';

/** How long a start's request waits for the conversation's finishing run to go. */
export const FINISHING_RUN_WAIT_MS = 750;
/** How long a start goes on watching a run slower to finish, once its request is answered. */
export const FINISHING_RUN_WATCH_MS = 30_000;
/** The watch's pace while the request waits, and once it is answered. */
const POLL_MS = 20;
const SLOW_POLL_MS = 200;

export interface FinishingRunDeps {
  jobs: Pick<ConversationJobs, 'state' | 'start'>;
  inbox: Pick<ConversationInbox, 'holders'>;
  stops: Pick<ConversationStops, 'read'>;
  store: Pick<ConversationStore, 'getConversation' | 'setStatus'>;
}

/** What this start read before it added its job. */
export interface StartSeen {
  /** The lease epoch: every holder bumps it first. */
  leaseEpoch: number;
  /** The stop mark: every stop and eviction bumps it first. */
  stopMark: number;
}

/** How a start starts the conversation again (the manager's slot and stop rules). */
export interface StartAgain {
  acquireSlot(): Promise<unknown>;
  stopRun(): Promise<void>;
}

/**
 * Adding a job while the conversation's previous run is finishing (its
 * session ended, its job not yet removed) adds nothing, and that run then
 * frees the slot: the start would be lost. An active job whose holder no
 * longer listens is such a run: wait for it to go, then start again.
 *
 * But this start's own job looks the same while a worker is just taking it,
 * and if the poll misses the short time it is held, it ran (and may have been
 * stopped) by the time it is gone: starting again would undo that stop. Every
 * holder bumps the lease epoch first, so a moved epoch (`seen.leaseEpoch`)
 * says a run began after this start: not lost.
 *
 * Nor may it undo a stop or an eviction that landed meanwhile (on the
 * finishing run, or on this start's job before any worker held it): both
 * bump the conversation's stop mark first, so a mark moved from
 * `seen.stopMark` ends the wait. It is read again once the job is added: a
 * stop that looked for the job just before would have missed it.
 *
 * The request waits `FINISHING_RUN_WAIT_MS` at most. A run slower to finish
 * (its Redis or Postgres slow to answer) is watched on after the request is
 * answered, `FINISHING_RUN_WATCH_MS` at most: the message that started this
 * would otherwise wait for the user's next one. What fails then (Redis away,
 * the user's slots taken) fails as the next start would.
 */
export async function startAfterFinishingRun(
  deps: FinishingRunDeps,
  ref: ConversationRef,
  seen: StartSeen,
  again: StartAgain,
): Promise<void> {
  const watching = watchFinishingRun(deps, ref, seen, again);
  const waited = new AbortController();
  const inTime = await Promise.race([
    watching.then(() => true),
    sleep(FINISHING_RUN_WAIT_MS, false, { signal: waited.signal }).catch(() => false),
  ]).finally(() => waited.abort());
  if (!inTime) watching.catch(() => undefined);
}

async function watchFinishingRun(
  { jobs, inbox, stops, store }: FinishingRunDeps,
  ref: ConversationRef,
  seen: StartSeen,
  again: StartAgain,
): Promise<void> {
  const began = Date.now();
  let sawUnheldRun = false;
  while (Date.now() - began < FINISHING_RUN_WATCH_MS) {
    const state = await jobs.state(ref.conversationId);
    if (state !== null && state !== 'active') return; // queued: a worker will take it
    if (state === 'active' && (await inbox.holders(ref.conversationId)) > 0) return; // held
    // Gone without a finishing run seen: it ran and ended, or an eviction cancelled it.
    if (state === null && !sawUnheldRun) return;
    if (state === null) {
      // A run that ended in error (too many failovers, a failed start) ended on purpose.
      const record = await store.getConversation(ref.tenantId, ref.conversationId);
      if (!record || record.status === 'ERROR') return;
      if (record.leaseEpoch !== seen.leaseEpoch) return; // held since this start: it ran
      if ((await stops.read(ref.conversationId)) !== seen.stopMark) return; // stopped since: it stays so
      await again.acquireSlot();
      await store.setStatus(ref.tenantId, ref.conversationId, 'STARTING', STARTABLE_STATUSES);
      await jobs.start(ref);
      if ((await stops.read(ref.conversationId)) !== seen.stopMark) await again.stopRun();
      return;
    }
    // Active with no listener: a worker just taking it (it subscribes first) or a run finishing.
    sawUnheldRun = true;
    await sleep(Date.now() - began < FINISHING_RUN_WAIT_MS ? POLL_MS : SLOW_POLL_MS);
  }
}

/**
 * The standalone manager's entry for a conversation it runs in this process,
 * starting or running: its session, and the promises that settle when its
 * start does and once it is gone.
 */
import type { AgentSession } from '../agent-session.js';
import type { ConversationRef } from '../conversation.js';

export interface StandaloneHostEntry {
  ref: ConversationRef;
  userKey: string;
  /** Start order, to break ties between equal activity times. */
  seq: number;
  startedAt: number;
  phase: 'starting' | 'running';
  /** Being stopped or closed: holds no slot, takes no work. */
  stopping: boolean;
  session: AgentSession | null;
  /** Settles when the start settles (rejects when it failed). */
  ready: Promise<void>;
  settleReady: { resolve: () => void; reject: (error: unknown) => void };
  /** Resolves once the entry is gone and its final status persisted. */
  done: Promise<void>;
  resolveDone: () => void;
}

/** A starting entry for `ref`, with no session yet. */
export function newStandaloneHostEntry(
  ref: ConversationRef,
  userKey: string,
  seq: number,
  startedAt: number,
): StandaloneHostEntry {
  let settleReady: StandaloneHostEntry['settleReady'] = { resolve: noop, reject: noop };
  const ready = new Promise<void>((resolve, reject) => {
    settleReady = { resolve, reject };
  });
  ready.catch(noop); // the callers that await it see the rejection
  let resolveDone: () => void = noop;
  const done = new Promise<void>((resolve) => {
    resolveDone = resolve;
  });
  return {
    ref: { ...ref },
    userKey,
    seq,
    startedAt,
    phase: 'starting',
    stopping: false,
    session: null,
    ready,
    settleReady,
    done,
    resolveDone,
  };
}

function noop(): void {}

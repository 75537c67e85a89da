/**
 * What a turn has done so far, read from the events stored after its
 * message: the steps it stored, its tool calls still without a result, and
 * the user's answer to those awaiting confirmation; and, from the
 * conversation's row, what it has cost. A new holder goes on from here after
 * a failover or a restart, without asking the agent again.
 */
import type { StoredEvent } from '@cs/protocol';
import { isAction, isObservation } from '@cs/protocol';
import { costSoFar, type TurnCost } from '../conversation.js';
import { readAgentStateChange } from './agent-state-change.js';

/** What a turn's stored events say of its progress (after a failover, a restart, a confirmation). */
export interface TurnProgress {
  /** Steps stored so far (each stored its tool calls). */
  steps: number;
  /** Ids of the events the turn stored. */
  events: Set<number>;
  /** Its tool calls without a result, oldest first. */
  unresolved: StoredEvent[];
  /** The user's answer to the pending calls, if one was stored. */
  confirmation: 'awaiting' | 'confirmed' | 'rejected' | null;
  /** What its steps have cost (checked against the budget before each step). */
  costUsd: number;
}

export function emptyProgress(): TurnProgress {
  return { steps: 0, events: new Set(), unresolved: [], confirmation: null, costUsd: 0 };
}

/**
 * Reads a turn's progress from the events stored after its trigger, and its
 * cost from the turn cost its conversation's row counted.
 */
export function readTurnProgress(
  trigger: StoredEvent,
  after: readonly StoredEvent[],
  counted: TurnCost | null,
): TurnProgress {
  const progress = emptyProgress();
  progress.costUsd = costSoFar(counted, trigger.id);
  const calls = new Map<number, StoredEvent>();
  let previousWasCall = false;
  for (const event of after) {
    const inTurn =
      event.source !== 'user' &&
      (event.cause === trigger.id ||
        (event.cause !== undefined && progress.events.has(event.cause)));
    const change = readAgentStateChange(event);
    if (
      change &&
      (change.agentState === 'user_confirmed' || change.agentState === 'user_rejected')
    ) {
      if (calls.size > 0)
        progress.confirmation = change.agentState === 'user_confirmed' ? 'confirmed' : 'rejected';
      continue;
    }
    if (!inTurn) continue;
    progress.events.add(event.id);
    if (isAction(event) && event.action === 'tool_call') {
      if (!previousWasCall) progress.steps += 1;
      calls.set(event.id, event);
      previousWasCall = true;
      continue;
    }
    previousWasCall = false;
    if (isObservation(event) && event.observation === 'tool_result' && event.cause !== undefined) {
      calls.delete(event.cause);
    } else if (change?.agentState === 'awaiting_user_confirmation') {
      progress.confirmation = 'awaiting';
    }
  }
  progress.unresolved = [...calls.values()];
  if (progress.unresolved.length === 0) progress.confirmation = null;
  return progress;
}

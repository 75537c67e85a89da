// Long histories written straight into a run's database through the
// service's own store (dist/libs/store, `store.append` in batches): turns as
// the echo agent would have stored them (user message, `running`, the answer,
// `awaiting_user_input`, the answer settling its message). Far faster than
// the API, which takes at most 1,000 events per `replay_json`.
import { openStore } from '../../dist/libs/store/src/index.js';

export const HISTORY_BATCH = 500;
/** Events a stored turn has. */
export const EVENTS_PER_TURN = 4;

/** The text of turn `n`'s user message and answer. */
export const turnText = (n) => {
  const content = `message ${n} of a long conversation, as a person would type it`;
  return { content, answer: `echo: ${content}. `.repeat(3).trim() };
};

/** The events of turn `n`, its user message at id `first`. */
function turn(first, n) {
  const { content, answer } = turnText(n);
  const state = (agentState, extra = {}) => ({
    source: 'environment',
    body: {
      observation: 'agent_state_changed',
      content: '',
      extras: { agent_state: agentState },
      message: `Agent state changed to ${agentState}`,
    },
    cause: first,
    ...extra,
  });
  return [
    { source: 'user', body: { action: 'message', args: { content }, message: content } },
    state('running'),
    {
      source: 'agent',
      body: { action: 'message', args: { content: answer }, message: answer },
      cause: first,
      answers: first,
    },
    state('awaiting_user_input', { answers: first }),
  ];
}

/** The store on the cluster's database; `close()` when done. */
export function openHistoryStore(cluster) {
  return openStore({ databaseUrl: cluster.databaseUrl, dataDir: '', migrate: false, poolSize: 4 });
}

/**
 * Appends whole turns (at least `events` events) to a conversation of
 * `tenantId` whose last event id is `lastId`, which nothing else writes to
 * meanwhile. Resolves with `{ lastId, turns }`.
 */
export async function seedHistory(store, tenantId, conversationId, lastId, events) {
  const turns = Math.ceil(events / EVENTS_PER_TURN);
  let next = lastId + 1;
  for (let n = 0; n < turns;) {
    const drafts = [];
    while (drafts.length < HISTORY_BATCH && n < turns) {
      drafts.push(...turn(next + drafts.length, n));
      n += 1;
    }
    const appended = await store.append(tenantId, conversationId, drafts);
    next = appended[appended.length - 1].event.id + 1;
  }
  return { lastId: next - 1, turns };
}

/**
 * Appends `count` copies of one user event (`body`), in batches: a long
 * history of small events, as `replay_json` would store them (it takes at
 * most 1,000 events a conversation).
 */
export async function seedUserEvents(store, tenantId, conversationId, count, body) {
  for (let written = 0; written < count; written += HISTORY_BATCH) {
    const size = Math.min(HISTORY_BATCH, count - written);
    await store.append(
      tenantId,
      conversationId,
      Array.from({ length: size }, () => ({ source: 'user', body })),
    );
  }
}

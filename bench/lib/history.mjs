// Long histories written straight into a run's database through the
// service's own store (dist/libs/store, `store.append` in batches): turns as
// the echo agent would have stored them (user message, `running`, the answer,
// `awaiting_user_input`, the answer settling its message). Far faster than
// the API, which takes at most 1,000 events per `replay_json`. Many copies
// of one stored history are made in SQL (`cloneHistory`).
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

/** The columns of `table` that an INSERT may set, but `except`. */
async function insertableColumns(db, table, except) {
  const { rows } = await db.query(
    `SELECT column_name FROM information_schema.columns
      WHERE table_schema = current_schema() AND table_name = $1 AND is_generated = 'NEVER'
      ORDER BY ordinal_position`,
    [table],
  );
  return rows.map((row) => row.column_name).filter((name) => !except.includes(name));
}

/**
 * Copies conversation `templateId` (its row and its events) `copies` times
 * in SQL, `batch` copies a statement: each copy a new id and incarnation,
 * titled `${title} n`, everything else as the template's, columns added
 * later included. Thousands of stored histories in seconds, rows as the
 * service wrote them. Resolves with the copies' ids.
 */
export async function cloneHistory(db, templateId, copies, { title = 'copy', batch = 500 } = {}) {
  const conversationColumns = await insertableColumns(db, 'conversations', [
    'id',
    'incarnation',
    'title',
  ]);
  const eventColumns = await insertableColumns(db, 'events', ['conversation_id']);
  const list = (columns, alias) => columns.map((c) => `${alias}"${c}"`).join(', ');
  const sql = `
    WITH made AS (
      INSERT INTO conversations (id, title, ${list(conversationColumns, '')})
      SELECT gen_random_uuid(), $2 || ' ' || n, ${list(conversationColumns, 't.')}
        FROM conversations t, generate_series($3::int, $4::int) n
       WHERE t.id = $1
      RETURNING id
    ), copied AS (
      INSERT INTO events (conversation_id, ${list(eventColumns, '')})
      SELECT made.id, ${list(eventColumns, 'e.')}
        FROM made CROSS JOIN events e
       WHERE e.conversation_id = $1
    )
    SELECT id FROM made`;
  const ids = [];
  for (let from = 1; from <= copies; from += batch) {
    const to = Math.min(copies, from + batch - 1);
    const { rows } = await db.query(sql, [templateId, title, from, to]);
    ids.push(...rows.map((row) => row.id));
  }
  return ids;
}

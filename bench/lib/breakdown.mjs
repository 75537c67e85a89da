// Where a round trip's time goes, from the events' own timestamps in
// Postgres (taken inside each append's transaction, on the same clock as the
// client): the gateway storing the user event, the worker storing `running`,
// the agent's answer being stored, and the answer reaching the client.
import { summarize } from './stats.mjs';

const STAMPS_SQL = `
  SELECT conversation_id::text AS conversation_id, id, source, type, cause,
         payload->'extras'->>'agent_state' AS agent_state,
         (extract(epoch FROM created_at) * 1000)::float8 AS at
    FROM events
   WHERE conversation_id = ANY($1::uuid[])
     AND (source = 'user' OR type = 'message' OR payload->'extras'->>'agent_state' = 'running')`;

const BATCH = 200;

/**
 * @param trips `{ conversationId, eventId, wall: { sent, acked, answered } }`
 *   (wall-clock epoch ms) of answered round trips
 */
export async function roundTripBreakdown(cluster, trips) {
  if (trips.length === 0) return {};
  const ids = [...new Set(trips.map((t) => t.conversationId))];
  const userAt = new Map();
  const runningAt = new Map();
  const answerAt = new Map();
  for (let i = 0; i < ids.length; i += BATCH) {
    const { rows } = await cluster.db.query(STAMPS_SQL, [ids.slice(i, i + BATCH)]);
    for (const row of rows) {
      const key = (cause) => `${row.conversation_id}/${cause}`;
      if (row.source === 'user') userAt.set(key(row.id), row.at);
      else if (row.type === 'agent_state_changed' && row.agent_state === 'running')
        runningAt.set(key(row.cause), row.at);
      else if (row.source === 'agent' && row.type === 'message')
        answerAt.set(key(row.cause), row.at);
    }
  }
  const parts = {
    gateway_store: { label: 'send → user event stamped (gateway)', samples: [] },
    ack_back: { label: 'user event stamped → ack at the client', samples: [] },
    worker_pickup: { label: 'user event stamped → running stamped (worker)', samples: [] },
    agent_turn: { label: 'running stamped → answer stamped (worker)', samples: [] },
    delivery: { label: 'answer stamped → answer at the client', samples: [] },
  };
  for (const trip of trips) {
    const key = `${trip.conversationId}/${trip.eventId}`;
    const user = userAt.get(key);
    const running = runningAt.get(key);
    const answer = answerAt.get(key);
    if (user === undefined || running === undefined || answer === undefined) continue;
    parts.gateway_store.samples.push(user - trip.wall.sent);
    parts.ack_back.samples.push(trip.wall.acked - user);
    parts.worker_pickup.samples.push(running - user);
    parts.agent_turn.samples.push(answer - running);
    parts.delivery.samples.push(trip.wall.answered - answer);
  }
  const result = {};
  for (const [key, part] of Object.entries(parts)) {
    result[key] = { label: part.label, ...summarize(part.samples) };
  }
  return result;
}

export function formatBreakdown(breakdown, indent = '    ') {
  return Object.values(breakdown).map(
    (part) =>
      `${indent}${part.label.padEnd(46)} p50 ${part.p50} ms  p95 ${part.p95} ms  p99 ${part.p99} ms`,
  );
}

// Forks of a long conversation (docs/protocol.md "Branching"): one conversation
// of 10,000 events (`--history-events`) written straight into the run's
// database through the service's own store, then forked again and again
// over REST, at its last event and half-way, one fork at a time: the time of
// `POST /conversations/:id/fork` as a client sees it, through a gateway.
// The copy is one INSERT … SELECT; the target is ≤ 200 ms p50 at 10,000 events.
import { openHistoryStore, seedHistory } from '../lib/history.mjs';
import { api, createConversation } from '../lib/client.mjs';
import { formatSummary, round, summarize } from '../lib/stats.mjs';

const TENANT = 'bench';
const USER = 'fork';
const TARGET_P50_MS = 200;

export async function runFork(ctx) {
  const { cluster, options, log } = ctx;
  const forks = options.quick ? 5 : 30;
  const events = options.historyEvents;
  const url = cluster.gateways[0].url;
  const token = await ctx.token(USER);
  const opened = await openHistoryStore(cluster);
  let lastId;
  let id;
  try {
    id = await createConversation(url, token, { title: 'a long conversation to fork' });
    const info = await api(url, token, 'GET', `/api/conversations/${id}`);
    ({ lastId } = await seedHistory(opened.store, TENANT, id, info.last_event_id, events));
  } finally {
    await opened.close();
  }
  log(`  seeded one conversation of ${lastId + 1} events`);

  const timeForks = async (atEventId) => {
    const samples = [];
    for (let n = 0; n < forks; n += 1) {
      const started = performance.now();
      const answer = await api(url, token, 'POST', `/api/conversations/${id}/fork`, {
        at_event_id: atEventId,
      });
      samples.push(performance.now() - started);
      if (!answer?.conversation_id) throw new Error(`fork failed: ${JSON.stringify(answer)}`);
    }
    return summarize(samples);
  };
  // One fork first, not counted: code compiled, connections opened.
  await timeForks(lastId);
  const whole = await timeForks(lastId);
  const half = await timeForks(Math.floor(lastId / 2));
  log(`  fork of ${lastId + 1} events            ${formatSummary(whole)}`);
  log(`  fork of ${Math.floor(lastId / 2) + 1} events (half-way)  ${formatSummary(half)}`);
  const met = whole.p50 !== null && whole.p50 <= TARGET_P50_MS;
  log(`  target p50 ≤ ${TARGET_P50_MS} ms: ${met ? 'met' : 'MISSED'}`);
  return {
    events: lastId + 1,
    forks,
    whole,
    half,
    targetP50Ms: TARGET_P50_MS,
    met,
    eventsPerMs: whole.p50 ? round((lastId + 1) / whole.p50) : null,
  };
}

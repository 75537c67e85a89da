// Waiting for an answer over REST (`Prefer: wait`): one client, sequential,
// against the echo agent. The waited REST round trip (POST …/events that
// answers with the turn) next to the plain round trip of a socket client
// (message → echo), on the same gateway, alternating so that both see the
// same load: the contract's target is a waited p50 at most twice the plain.
import { connectConversation, createConversation, stopConversation } from '../lib/client.mjs';
import { formatSummary, round, summarize } from '../lib/stats.mjs';

const READY_TIMEOUT_MS = 20_000;

/** One waited REST round trip: the turn comes back in the response. */
async function waitedRoundTrip(baseUrl, token, conversationId, content) {
  const started = performance.now();
  const response = await fetch(`${baseUrl}/api/conversations/${conversationId}/events`, {
    method: 'POST',
    headers: {
      authorization: `Bearer ${token}`,
      'content-type': 'application/json',
      prefer: 'wait=10',
    },
    body: JSON.stringify({ action: 'message', args: { content } }),
  });
  const body = await response.json();
  const total = performance.now() - started;
  if (response.status !== 201) throw new Error(`POST: ${response.status} ${JSON.stringify(body)}`);
  if (body.turn?.agent_state !== 'awaiting_user_input') {
    throw new Error(`no answer within the wait: ${JSON.stringify(body.turn)}`);
  }
  return total;
}

export async function runRestWait(ctx) {
  const { cluster, options, log } = ctx;
  const gateway = cluster.gateways[0];
  const token = await ctx.token('rest-wait');
  const plainId = await createConversation(gateway.url, token, { title: 'bench plain' });
  const waitedId = await createConversation(gateway.url, token, { title: 'bench waited' });
  const socket = await connectConversation(gateway.url, token, plainId);
  try {
    await socket.ready(READY_TIMEOUT_MS);
    const warmup = options.quick ? 20 : 300;
    const iterations = options.quick ? 100 : options.roundTrips;
    for (let i = 0; i < warmup; i += 1) {
      await socket.roundTrip(`warm-up ${i}`);
      await waitedRoundTrip(gateway.url, token, waitedId, `warm-up ${i}`);
    }
    const plain = [];
    const waited = [];
    let errors = 0;
    for (let i = 0; i < iterations; i += 1) {
      try {
        plain.push((await socket.roundTrip(`plain ${i}`)).total);
        waited.push(await waitedRoundTrip(gateway.url, token, waitedId, `waited ${i}`));
      } catch (error) {
        errors += 1;
        if (errors <= 3) log(`  round trip ${i}: ${String(error)}`);
      }
    }
    const plainLatency = summarize(plain);
    const waitedLatency = summarize(waited);
    const ratio = round(waitedLatency.p50 / plainLatency.p50);
    log(`  plain (socket) message → echo   ${formatSummary(plainLatency)}`);
    log(`  waited REST (Prefer: wait)      ${formatSummary(waitedLatency)}`);
    log(`  waited p50 / plain p50 = ${ratio} (target ≤ 2)`);
    return { plain: plainLatency, waited: waitedLatency, ratio, target: 2, errors };
  } finally {
    socket.close();
    await stopConversation(gateway.url, token, plainId).catch(() => undefined);
    await stopConversation(gateway.url, token, waitedId).catch(() => undefined);
  }
}

// A turn cut short, as its client sees it: a conversation streams a long turn
// (the bench_pacer agent, 20 deltas/s for far longer than the measure), and
// the client either stops it (`change_agent_state` stopped) or, under the
// `interrupt` strategy, sends another message. Measured from the send to the
// cut turn's interrupted answer at the client: the contract's "stops within
// 1 s" (docs/protocol.md, multitask strategies and stop). One conversation at
// a time, each cut after a few deltas.
import { connectConversation, createConversation, stopConversation } from '../lib/client.mjs';
import { formatSummary, summarize } from '../lib/stats.mjs';

const READY_TIMEOUT_MS = 20_000;
const CUT_TIMEOUT_MS = 10_000;
export const STOP_BOUND_MS = 1_000;
/** A turn that would stream for 500 s if nothing cut it. */
const LONG_TURN = JSON.stringify({ rate: 20, count: 10_000 });
/** The interrupting message's own turn: one delta, then its answer. */
const SHORT_TURN = JSON.stringify({ rate: 1000, count: 1 });
const DELTAS_BEFORE_THE_CUT = 3;

const isDeltaOf = (cause) => (event) => event.stream === true && event.cause === cause;
const isStopped = (event) =>
  event.observation === 'agent_state_changed' && event.extras?.agent_state === 'stopped';
const isInterruptedAnswerTo = (cause) => (event) =>
  event.source === 'agent' &&
  event.action === 'message' &&
  event.cause === cause &&
  event.args?.interrupted === true;

/**
 * Starts the long turn, waits for its first deltas, cuts it with `cut`, and
 * times the cut; returns once the conversation has settled after it (the
 * agent stopped, or the interrupting message answered).
 */
async function timeOneCut(socket, strategy) {
  const emit = (payload) =>
    socket.socket.timeout(CUT_TIMEOUT_MS).emitWithAck('oh_user_action', payload);
  const ack = await emit({ action: 'message', args: { content: LONG_TURN } });
  if (!ack?.ok) throw new Error(`the long turn was refused: ${JSON.stringify(ack?.error)}`);
  const cause = ack.event_id;
  let deltas = 0;
  await socket.waitFor(
    (event) => isDeltaOf(cause)(event) && (deltas += 1) >= DELTAS_BEFORE_THE_CUT,
    CUT_TIMEOUT_MS,
    'the long turn to stream',
  );
  const answered = socket.waitFor(
    isInterruptedAnswerTo(cause),
    CUT_TIMEOUT_MS,
    `the interrupted answer to event ${cause}`,
  );
  const stopped =
    strategy === 'stop'
      ? socket.waitFor(isStopped, CUT_TIMEOUT_MS, 'agent_state stopped')
      : undefined;
  const sentAt = performance.now();
  const cutAck = await emit(
    strategy === 'stop'
      ? { action: 'change_agent_state', args: { agent_state: 'stopped' } }
      : { action: 'message', args: { content: SHORT_TURN } },
  );
  if (!cutAck?.ok) throw new Error(`the cut was refused: ${JSON.stringify(cutAck?.error)}`);
  const ms = (await answered) - sentAt;
  await (stopped ?? socket.answerTo(cutAck.event_id, CUT_TIMEOUT_MS));
  return ms;
}

async function measure(ctx, strategy, count) {
  const gateway = ctx.cluster.gateways[0];
  const token = await ctx.token(`stop-${strategy}`);
  const id = await createConversation(gateway.url, token, {
    title: `bench ${strategy}`,
    agent: 'bench_pacer',
    multitask_strategy: strategy === 'interrupt' ? 'interrupt' : 'enqueue',
  });
  const socket = await connectConversation(gateway.url, token, id);
  const samples = [];
  let errors = 0;
  try {
    await socket.ready(READY_TIMEOUT_MS);
    for (let i = 0; i < count; i += 1) {
      try {
        samples.push(await timeOneCut(socket, strategy));
      } catch (error) {
        errors += 1;
        if (errors <= 3) ctx.log(`  ${strategy} ${i}: ${String(error)}`);
      }
    }
  } finally {
    socket.close();
    await stopConversation(gateway.url, token, id).catch(() => undefined);
  }
  return { latency: summarize(samples), errors };
}

export async function runStop(ctx) {
  const count = ctx.options.quick ? 5 : 50;
  const stop = await measure(ctx, 'stop', count);
  ctx.log(`  stop → interrupted answer        ${formatSummary(stop.latency)}`);
  const interrupt = await measure(ctx, 'interrupt', count);
  ctx.log(`  interrupt → interrupted answer   ${formatSummary(interrupt.latency)}`);
  return { stop, interrupt, bound: STOP_BOUND_MS };
}

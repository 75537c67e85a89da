import { describe, expect, it } from 'vitest';
import { AppendBatcher, type WriteBatch } from './append-batcher.js';
import type { AppendedHead, PlainAppend } from './repositories/event-append.repository.js';

function plain(conversationId: string): PlainAppend {
  return {
    tenantId: 't',
    conversationId,
    rowsJson: '[]',
    count: 1,
    clientEventIds: [],
    leaseEpoch: null,
    incarnation: null,
    answeredThrough: null,
    agentState: null,
    stateSet: '{}',
    stateDeleted: [],
    metrics: { iterations: 0, prompt_tokens: 0, completion_tokens: 0, cost_usd: 0 },
    turnCost: null,
    undoneUnderReject: false,
  };
}

/** A writer whose statements finish when the test says so; records each batch. */
function manualWriter(options: { failFor?: string } = {}) {
  const batches: string[][] = [];
  const open: Array<() => void> = [];
  const write: WriteBatch = async (appends) => {
    const ids = appends.map((a) => a.conversationId);
    batches.push(ids);
    await new Promise<void>((resolve) => open.push(resolve));
    if (options.failFor && ids.includes(options.failFor)) throw new Error(`bad ${options.failFor}`);
    return new Map<string, AppendedHead>(
      ids.filter((id) => id !== 'gone').map((id, i) => [id, { firstId: i, at: new Date(0) }]),
    );
  };
  const finishAll = async () => {
    while (open.length > 0) {
      open.splice(0).forEach((finish) => finish());
      await new Promise((resolve) => setImmediate(resolve));
    }
  };
  return { write, batches, finishAll };
}

describe(AppendBatcher.name, () => {
  it('sends an append at once when nothing is in flight', async () => {
    const writer = manualWriter();
    const batcher = new AppendBatcher(writer.write, { maxInFlight: 1, maxBatch: 10 });
    const done = batcher.append(plain('a'));
    expect(writer.batches).toEqual([['a']]);
    await writer.finishAll();
    await expect(done).resolves.toEqual({ firstId: 0, at: new Date(0) });
  });

  it('sends what queued meanwhile together, one append per conversation and batch', async () => {
    const writer = manualWriter();
    const batcher = new AppendBatcher(writer.write, { maxInFlight: 1, maxBatch: 3 });
    const results = ['a', 'b', 'c', 'b', 'd', 'e'].map((id) => batcher.append(plain(id)));
    await writer.finishAll();
    await Promise.all(results);
    expect(writer.batches).toEqual([['a'], ['b', 'c', 'd'], ['b', 'e']]);
  });

  it('answers null for an append the statement left undone', async () => {
    const writer = manualWriter();
    const batcher = new AppendBatcher(writer.write, { maxInFlight: 1, maxBatch: 10 });
    const results = ['a', 'gone', 'b'].map((id) => batcher.append(plain(id)));
    await writer.finishAll();
    const heads = await Promise.all(results);
    expect(heads.map((head) => head === null)).toEqual([false, true, false]);
  });

  it('sends each append of a failed batch again alone, failing only its own caller', async () => {
    const writer = manualWriter({ failFor: 'bad' });
    const batcher = new AppendBatcher(writer.write, { maxInFlight: 1, maxBatch: 10 });
    const first = batcher.append(plain('first'));
    const results = Promise.allSettled(['a', 'bad', 'b'].map((id) => batcher.append(plain(id))));
    await writer.finishAll();
    await first;
    const settled = await results;
    expect(settled.map((s) => s.status)).toEqual(['fulfilled', 'rejected', 'fulfilled']);
    expect(writer.batches).toEqual([['first'], ['a', 'bad', 'b'], ['a'], ['bad'], ['b']]);
  });
});

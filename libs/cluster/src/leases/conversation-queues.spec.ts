import { randomUUID } from 'node:crypto';
import calculateSlot from 'cluster-key-slot';
import { describe, expect, it } from 'vitest';
import {
  CONVERSATION_QUEUE,
  REDIS_CLUSTER_SLOTS,
  conversationQueueIndex,
  conversationQueueNames,
  queueSlot,
} from './conversation-queues.js';

const COUNTS = [1, 2, 4, 8, 16, 64, 256, 1024];

describe('conversation queues', () => {
  it('keeps the one queue of a deployment with one queue as it was named before', () => {
    expect(conversationQueueNames(1)).toEqual([CONVERSATION_QUEUE]);
    expect(CONVERSATION_QUEUE).toBe('{conversations}');
  });

  it.each(COUNTS.filter((count) => count > 1))(
    'gives each of %i queues its own hash tag, its slot in its own slice of the slot range',
    (count) => {
      const names = conversationQueueNames(count);
      expect(names.length).toBe(count);
      const width = REDIS_CLUSTER_SLOTS / count;
      names.forEach((name, index) => {
        // The whole name is one tag: every BullMQ key of the queue is in its slot.
        expect(name).toMatch(/^\{[^{}:]+\}$/);
        const slot = queueSlot(name);
        expect(slot).toBe(calculateSlot(`cs:${name}:wait`));
        expect(slot).toBeGreaterThanOrEqual(index * width);
        expect(slot).toBeLessThan((index + 1) * width);
      });
      // Masters owning even ranges hold even shares of the queues: a range cut
      // through two slices may hold one queue more or less at each end.
      for (const masters of [3, 5]) {
        const perMaster = Array.from({ length: masters }, () => 0);
        for (const name of names) {
          perMaster[Math.floor((queueSlot(name) * masters) / REDIS_CLUSTER_SLOTS)]! += 1;
        }
        if (count >= masters) {
          expect(Math.max(...perMaster) - Math.min(...perMaster)).toBeLessThanOrEqual(2);
        }
      }
    },
  );

  it('names the queues the same on every process and in every release (changing them strands jobs)', () => {
    expect(conversationQueueNames(2)).toEqual(['{conversations-0-0}', '{conversations-1-0}']);
    expect(conversationQueueNames(8)).toEqual([
      '{conversations-0-1}',
      '{conversations-1-43}',
      '{conversations-2-43}',
      '{conversations-3-1}',
      '{conversations-4-42}',
      '{conversations-5-1}',
      '{conversations-6-1}',
      '{conversations-7-42}',
    ]);
  });

  it.each(COUNTS)(
    "puts a conversation in the queue of its id's slice, the same every time (%i queues)",
    (count) => {
      const ids = Array.from({ length: 4000 }, () => randomUUID());
      const perQueue = Array.from({ length: count }, () => 0);
      for (const id of ids) {
        const index = conversationQueueIndex(id, count);
        expect(conversationQueueIndex(id, count)).toBe(index);
        expect(Math.floor((calculateSlot(`cs:conv:{${id}}:stops`) * count) / 16_384)).toBe(index);
        perQueue[index]! += 1;
      }
      // Spread: with 4000 random ids, no queue of a few is far from its share.
      if (count <= 8) {
        for (const n of perQueue) expect(n).toBeGreaterThan((ids.length / count) * 0.8);
      }
      expect(conversationQueueIndex('0b0c6f1e-5d7a-4c1e-9a53-2f4b8c1d9e70', count)).toBe(
        Math.floor(
          (calculateSlot('0b0c6f1e-5d7a-4c1e-9a53-2f4b8c1d9e70') * count) / REDIS_CLUSTER_SLOTS,
        ),
      );
    },
  );

  it('refuses a queue count that is not a power of two from 1 to 1024', () => {
    for (const count of [0, 3, 12, 2048, 1.5]) {
      expect(() => conversationQueueNames(count)).toThrow(/power of two/);
      expect(() => conversationQueueIndex('x', count)).toThrow(/power of two/);
    }
  });
});

/**
 * The BullMQ queues live conversations are spread over (`CONVERSATION_QUEUES`),
 * and which one a conversation's job goes to.
 *
 * A BullMQ queue lives in one Redis Cluster slot (its name carries a hash
 * tag), so one queue is one master's work. With N queues, queue i's tag is
 * the first `conversations-<i>-<k>` (k = 0, 1, …) whose slot lies in slice i
 * of the slot range (slots [i·16384/N, (i+1)·16384/N)): the queues spread
 * evenly over the slots, hence over masters that own even ranges, and every
 * process derives the same names. One queue keeps today's name
 * `{conversations}`, so that a deployment from before keeps its jobs.
 *
 * A conversation goes to the queue of its id's slice (the slot of its id is
 * the slot of its own keys, tagged `{<id>}`): stable, and on a cluster whose
 * masters own whole slices, its job sits on the master of its other keys.
 */
import calculateSlot from 'cluster-key-slot';

/** Slots of a Redis Cluster. */
export const REDIS_CLUSTER_SLOTS = 16_384;
/** The largest `CONVERSATION_QUEUES`. */
export const MAX_CONVERSATION_QUEUES = 1024;
/** The queue of a deployment with one queue (and of every deployment before there were more). */
export const CONVERSATION_QUEUE = '{conversations}';

const namesByCount = new Map<number, readonly string[]>();

/** The names of `count` queues, by index (computed once per count and process). */
export function conversationQueueNames(count: number): readonly string[] {
  assertQueueCount(count);
  let names = namesByCount.get(count);
  if (!names) {
    names = count === 1 ? [CONVERSATION_QUEUE] : tagsInSlices(count).map((tag) => `{${tag}}`);
    namesByCount.set(count, names);
  }
  return names;
}

/** Which of `count` queues holds the conversation's job. */
export function conversationQueueIndex(conversationId: string, count: number): number {
  assertQueueCount(count);
  return Math.floor((calculateSlot(conversationId) * count) / REDIS_CLUSTER_SLOTS);
}

/** The slot of a queue's keys (its name's hash tag). */
export function queueSlot(queueName: string): number {
  return calculateSlot(queueName);
}

function tagsInSlices(count: number): string[] {
  const width = REDIS_CLUSTER_SLOTS / count;
  return Array.from({ length: count }, (_, index) => {
    for (let k = 0; ; k += 1) {
      const tag = `conversations-${index}-${k}`;
      if (Math.floor(calculateSlot(tag) / width) === index) return tag;
    }
  });
}

function assertQueueCount(count: number): void {
  if (!Number.isInteger(count) || count < 1 || count > MAX_CONVERSATION_QUEUES)
    throw new RangeError(`queue count ${count}: must be a power of two from 1 to 1024`);
  if ((count & (count - 1)) !== 0)
    throw new RangeError(`queue count ${count}: must be a power of two from 1 to 1024`);
}

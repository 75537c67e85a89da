// The user slots contract (test/integration/user-slots.contract.ts) against
// the standalone manager's UserSlots: a claim adds a starting entry, as the
// manager's start does; the manager stops an evicted entry, so the adapter
// drops it at once (its stop is done).
import { userSlotsContract } from '../../../../test/integration/user-slots.contract.js';
import type { AgentSession } from '../agent-session.js';
import { ConcurrencyLimitError } from '../errors.js';
import { newStandaloneHostEntry, type StandaloneHostEntry } from './standalone-host-entry.js';
import { UserSlots, userKeyOf } from './user-slots.js';

userSlotsContract(UserSlots.name, () =>
  Promise.resolve({
    create({ limit, policy }) {
      const live = new Map<string, StandaloneHostEntry>();
      const slots = new UserSlots({
        live,
        limits: { maxConcurrentConversations: limit, concurrencyPolicy: policy },
        assertOpen: () => undefined,
        metrics: { limitEviction: () => undefined, limitRejection: () => undefined },
      });
      let seq = 0;
      return {
        async start(owner) {
          const ref = { ...owner, incarnation: 'contract' };
          try {
            const claimed = await slots.claim(ref, (userKey) =>
              newStandaloneHostEntry(ref, userKey, (seq += 1), Date.now()),
            );
            for (const victim of claimed.evicted) live.delete(victim.ref.conversationId);
            return {
              outcome: claimed.created ? 'taken' : 'held',
              evicted: claimed.evicted.map((victim) => victim.ref.conversationId),
            };
          } catch (error) {
            if (error instanceof ConcurrencyLimitError) return { outcome: 'refused', evicted: [] };
            throw error;
          }
        },
        reserve: (owner) => slots.reserve(owner),
        touch(owner, at) {
          const entry = live.get(owner.conversationId);
          // Eviction reads only the session's last activity.
          if (entry) entry.session = { lastActivity: at } as AgentSession;
          return Promise.resolve();
        },
        stop(owner) {
          const entry = live.get(owner.conversationId);
          if (entry && entry.userKey === userKeyOf(owner)) live.delete(owner.conversationId);
          return Promise.resolve();
        },
        holders: (user) =>
          Promise.resolve(slots.liveOf(userKeyOf(user)).map((entry) => entry.ref.conversationId)),
      };
    },
    teardown: () => Promise.resolve(),
  }),
);

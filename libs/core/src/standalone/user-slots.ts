/**
 * Each user's slots in the standalone manager: the live entries and the
 * reservations count against the limit, decided under a per-user mutex.
 * Each eviction and each refusal is decided here, so it is counted here.
 */
import { Mutex } from 'async-mutex';
import type { ConcurrencyPolicy } from '@cs/protocol';
import type { ConversationRef } from '../conversation.js';
import { HELD_SLOT, type SlotClaim, type SlotOwner } from '../conversation-limits.js';
import { ConcurrencyLimitError } from '../errors.js';
import type { StandaloneHostEntry } from './standalone-host-entry.js';
import type { ClusterMetrics } from '../ports/cluster-metrics.port.js';
import { SlotReservations } from './slot-reservations.js';

export interface UserSlotLimits {
  maxConcurrentConversations: number;
  concurrencyPolicy: ConcurrencyPolicy;
}

export interface UserSlotsDeps {
  /** The manager's live entries, by conversation id: a claim adds the new one. */
  live: Map<string, StandaloneHostEntry>;
  limits: UserSlotLimits;
  /** Throws when no slot may be taken any more (shutting down). */
  assertOpen: () => void;
  /** Where evictions and refusals are counted. */
  metrics: Pick<ClusterMetrics, 'limitEviction' | 'limitRejection'>;
}

/** What a claim got: `created` when `entry` is new; `evicted` are to be stopped before it starts. */
export interface ClaimedSlot {
  entry: StandaloneHostEntry | null;
  created: boolean;
  evicted: StandaloneHostEntry[];
}

export class UserSlots {
  private readonly live: Map<string, StandaloneHostEntry>;
  private readonly limits: UserSlotLimits;
  private readonly assertOpen: () => void;
  private readonly metrics: UserSlotsDeps['metrics'];
  private readonly reservations = new SlotReservations();
  private readonly userLocks = new Map<string, Mutex>();

  constructor(deps: UserSlotsDeps) {
    this.live = deps.live;
    this.limits = deps.limits;
    this.assertOpen = deps.assertOpen;
    this.metrics = deps.metrics;
  }

  /**
   * Takes a slot for `ref` (evicting or refusing at the limit) and adds the
   * entry `create` makes to the live entries. `entry` is the existing one
   * when there is one, and null when it is being stopped.
   */
  claim(
    ref: ConversationRef,
    create: (userKey: string) => StandaloneHostEntry,
  ): Promise<ClaimedSlot> {
    const userKey = userKeyOf(ref);
    return this.userLock(userKey).runExclusive(() => {
      this.assertOpen();
      const evicted: StandaloneHostEntry[] = [];
      const existing = this.live.get(ref.conversationId);
      if (existing) return { entry: existing.stopping ? null : existing, created: false, evicted };
      // A slot reserved for this start (`reserve`) becomes the entry's.
      if (!this.reservations.takeOver(ref.conversationId)) {
        const limit = this.limits.maxConcurrentConversations;
        const mine = this.liveOf(userKey);
        const held = mine.length + this.reservations.countFor(userKey);
        if (held >= limit) {
          if (this.limits.concurrencyPolicy === 'reject') throw this.refusal();
          mine.sort((a, b) => activityOf(a) - activityOf(b) || a.seq - b.seq);
          for (const victim of mine.slice(0, held - limit + 1)) {
            victim.stopping = true;
            evicted.push(victim);
            this.metrics.limitEviction();
          }
        }
      }
      const entry = create(userKey);
      this.live.set(ref.conversationId, entry);
      return { entry, created: true, evicted };
    });
  }

  /**
   * Reserves a slot for a conversation that a write about to be stored will
   * start (`claimSlot`), refusing at the limit whatever the policy: the start
   * that follows the store takes the reservation over.
   */
  async reserve(owner: SlotOwner): Promise<SlotClaim> {
    const userKey = userKeyOf(owner);
    const id = owner.conversationId;
    return this.userLock(userKey).runExclusive(() => {
      this.assertOpen();
      const existing = this.live.get(id);
      if (existing && !existing.stopping) return HELD_SLOT;
      if (!this.reservations.has(id)) {
        const limit = this.limits.maxConcurrentConversations;
        if (this.liveOf(userKey).length + this.reservations.countFor(userKey) >= limit) {
          throw this.refusal();
        }
      }
      // Once started, the reservation is the entry's: a release then gives nothing back.
      const release = this.reservations.claim(id, userKey);
      return {
        taken: true,
        release: () => {
          release();
          return Promise.resolve();
        },
      };
    });
  }

  /** The user's entries that hold a slot (starting or running, not being stopped). */
  liveOf(userKey: string): StandaloneHostEntry[] {
    return [...this.live.values()].filter((e) => e.userKey === userKey && !e.stopping);
  }

  /** CONCURRENCY_LIMIT_REACHED, counted. */
  private refusal(): ConcurrencyLimitError {
    this.metrics.limitRejection();
    return new ConcurrencyLimitError(this.limits.maxConcurrentConversations);
  }

  private userLock(key: string): Mutex {
    let mutex = this.userLocks.get(key);
    if (!mutex) {
      mutex = new Mutex();
      this.userLocks.set(key, mutex);
    }
    return mutex;
  }
}

/** The key of a user (per tenant) that slots are counted by. */
export function userKeyOf(ref: { tenantId: string; userId: string }): string {
  return JSON.stringify([ref.tenantId, ref.userId]);
}

/** When the entry was last active (its start, before it has a session): the least recent is evicted first. */
function activityOf(entry: StandaloneHostEntry): number {
  return entry.session?.lastActivity ?? entry.startedAt;
}

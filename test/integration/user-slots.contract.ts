// The behaviour both implementations of MAX_CONCURRENT_CONVERSATIONS share:
// the standalone manager's UserSlots (libs/core) and the cluster's
// UserConcurrencyLimiter on Redis (libs/cluster). Their interfaces differ
// (one holds live entries, the other ids in Redis), so each runner adapts
// its implementation to the few verbs below and calls `userSlotsContract`;
// the cases know neither.
import { ConcurrencyLimitError, type SlotClaim, type SlotOwner } from '@cs/core';
import type { ConcurrencyPolicy } from '@cs/protocol';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { uniqueName } from '../support/services.js';

export interface StartedSlot {
  /** `taken`: a slot is the conversation's now; `held`: it had one already. */
  outcome: 'taken' | 'held' | 'refused';
  /** The conversations evicted to make room (stopped by the caller). */
  evicted: string[];
}

/** One implementation's slots, for one limit and policy. */
export interface UserSlotsUnderTest {
  /** The conversation starts (or starts again): it takes its user's slot or keeps it. */
  start(owner: SlotOwner): Promise<StartedSlot>;
  /**
   * Takes the slot before what will start the conversation is stored (under
   * `reject`): throws ConcurrencyLimitError at the limit.
   */
  reserve(owner: SlotOwner): Promise<SlotClaim>;
  /** The conversation was last active at `at` (ms since 1970). */
  touch(owner: SlotOwner, at: number): Promise<void>;
  /** The conversation stopped (or was never running): it holds no slot. */
  stop(owner: SlotOwner): Promise<void>;
  /** The conversations of the user that hold a slot. */
  holders(owner: Omit<SlotOwner, 'conversationId'>): Promise<string[]>;
}

export interface UserSlotsFixture {
  create(limits: { limit: number; policy: ConcurrencyPolicy }): UserSlotsUnderTest;
  teardown(): Promise<void>;
}

export function userSlotsContract(
  name: string,
  makeFixture: () => Promise<UserSlotsFixture>,
): void {
  describe(`user slots contract: ${name}`, () => {
    let fixture: UserSlotsFixture;

    beforeAll(async () => {
      fixture = await makeFixture();
    });

    afterAll(async () => {
      await fixture?.teardown();
    });

    /**
     * A user (of a tenant of the case's own unless given) whose conversations
     * are named: ids are unique, as conversation ids are, and read back as names.
     */
    function newUser(slots: UserSlotsUnderTest, userId = 'alice', tenantId = uniqueName('tenant')) {
      const user = { tenantId, userId };
      const prefix = `${uniqueName('conversation')}-`;
      const owner = (name: string): SlotOwner => ({ ...user, conversationId: prefix + name });
      const named = (ids: string[]) => ids.map((id) => id.slice(prefix.length)).sort();
      return {
        user,
        owner,
        start: async (name: string) => {
          const { outcome, evicted } = await slots.start(owner(name));
          return { outcome, evicted: named(evicted) };
        },
        reserve: (name: string) => slots.reserve(owner(name)),
        touch: (name: string, at: number) => slots.touch(owner(name), at),
        stop: (name: string) => slots.stop(owner(name)),
        holders: async () => named(await slots.holders(user)),
      };
    }

    it('takes slots up to the limit, per user and tenant, and keeps the slot of a conversation that starts again', async () => {
      const slots = fixture.create({ limit: 2, policy: 'reject' });
      const alice = newUser(slots);
      expect(await alice.start('a')).toEqual({ outcome: 'taken', evicted: [] });
      expect(await alice.start('a')).toEqual({ outcome: 'held', evicted: [] });
      expect(await alice.start('b')).toEqual({ outcome: 'taken', evicted: [] });
      expect(await alice.start('c')).toEqual({ outcome: 'refused', evicted: [] });
      // A refusal changes nothing.
      expect(await alice.holders()).toEqual(['a', 'b']);
      expect(await alice.start('a')).toEqual({ outcome: 'held', evicted: [] });
      // Another user, and the same user in another tenant, have slots of their own.
      const bob = newUser(slots, 'bob', alice.user.tenantId);
      expect((await bob.start('c')).outcome).toBe('taken');
      const elsewhere = newUser(slots, 'alice');
      expect((await elsewhere.start('c')).outcome).toBe('taken');
      expect(await alice.holders()).toEqual(['a', 'b']);
    });

    it('under evict_oldest, evicts the least recently active to make room', async () => {
      const slots = fixture.create({ limit: 2, policy: 'evict_oldest' });
      const alice = newUser(slots);
      const at = Date.now() + 60_000;
      await alice.start('a');
      await alice.start('b');
      await alice.touch('a', at + 3);
      await alice.touch('b', at + 1);
      expect(await alice.start('c')).toEqual({ outcome: 'taken', evicted: ['b'] });
      expect(await alice.holders()).toEqual(['a', 'c']);
      await alice.touch('c', at + 5);
      expect(await alice.start('d')).toEqual({ outcome: 'taken', evicted: ['a'] });
      expect(await alice.holders()).toEqual(['c', 'd']);
      // A conversation holding its slot evicts nobody.
      expect(await alice.start('d')).toEqual({ outcome: 'held', evicted: [] });
    });

    it('gives an evicted conversation no slot: starting it again takes one', async () => {
      const slots = fixture.create({ limit: 1, policy: 'evict_oldest' });
      const alice = newUser(slots);
      await alice.start('a');
      expect(await alice.start('b')).toEqual({ outcome: 'taken', evicted: ['a'] });
      expect(await alice.holders()).toEqual(['b']);
      expect(await alice.start('a')).toEqual({ outcome: 'taken', evicted: ['b'] });
      expect(await alice.holders()).toEqual(['a']);
    });

    it("frees a stopped conversation's slot, and nobody else's", async () => {
      const slots = fixture.create({ limit: 1, policy: 'reject' });
      const alice = newUser(slots);
      const bob = newUser(slots, 'bob', alice.user.tenantId);
      await alice.start('a');
      await bob.start('x');
      await alice.stop('a');
      expect(await alice.holders()).toEqual([]);
      expect((await alice.start('b')).outcome).toBe('taken');
      // Stopping what holds no slot (again, or as another user) frees nothing.
      await alice.stop('a');
      await slots.stop({ ...bob.user, conversationId: alice.owner('b').conversationId });
      expect((await alice.start('c')).outcome).toBe('refused');
      expect(await alice.holders()).toEqual(['b']);
      expect(await bob.holders()).toEqual(['x']);
    });

    it('takes exactly the limit when many conversations start at once', async () => {
      const names = Array.from({ length: 12 }, (_, i) => `c${i}`);
      const refusing = newUser(fixture.create({ limit: 3, policy: 'reject' }));
      const results = await Promise.all(names.map((name) => refusing.start(name)));
      expect(results.filter((r) => r.outcome === 'taken')).toHaveLength(3);
      expect(results.filter((r) => r.outcome === 'refused')).toHaveLength(9);
      expect(await refusing.holders()).toHaveLength(3);

      const evicting = newUser(fixture.create({ limit: 3, policy: 'evict_oldest' }));
      const started = await Promise.all(names.map((name) => evicting.start(name)));
      expect(started.every((r) => r.outcome === 'taken')).toBe(true);
      // Each start past the limit makes room for itself by one eviction.
      const evicted = started.flatMap((r) => r.evicted);
      expect(evicted).toHaveLength(9);
      const holders = await evicting.holders();
      expect(holders).toHaveLength(3);
      expect([...holders, ...evicted].sort()).toEqual([...names].sort());
    });

    it('counts a reservation against the limit until it is given back, and its start uses it', async () => {
      const slots = fixture.create({ limit: 2, policy: 'reject' });
      const alice = newUser(slots);
      const claim = await alice.reserve('a');
      expect(claim.taken).toBe(true);
      await alice.start('b');
      await expect(alice.reserve('c')).rejects.toBeInstanceOf(ConcurrencyLimitError);
      expect((await alice.start('c')).outcome).toBe('refused');
      await claim.release();
      expect((await alice.reserve('c')).taken).toBe(true);
      // The start takes the reservation's slot, no second one.
      expect((await alice.start('c')).outcome).not.toBe('refused');
      expect(await alice.holders()).toEqual(['b', 'c']);
      expect((await alice.start('d')).outcome).toBe('refused');
    });

    it('reserves nothing for a conversation that holds its slot', async () => {
      const slots = fixture.create({ limit: 1, policy: 'reject' });
      const alice = newUser(slots);
      await alice.start('a');
      const claim = await alice.reserve('a');
      expect(claim.taken).toBe(false);
      await claim.release();
      expect(await alice.holders()).toEqual(['a']);
      await expect(alice.reserve('b')).rejects.toBeInstanceOf(ConcurrencyLimitError);
    });
  });
}

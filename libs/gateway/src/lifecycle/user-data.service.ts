/**
 * What a caller may do with a user's data as a whole (docs/protocol.md "Data
 * lifecycle"): erase it, export it, read the erasures and the tenant's audit
 * trail. A user acts on itself (`me` or its own id), an `admin` on any user
 * of its tenant; anyone else finds nothing (404, never 403), and nothing
 * tells whether a user exists: an erasure of an unknown one runs, and ends
 * with 0 conversations deleted.
 */
import { Inject, Injectable } from '@nestjs/common';
import { NotFoundError, type DataLifecycleStore } from '@cs/core';
import type { AuditPageView, AuditQuery, ErasureStatusView } from '@cs/protocol';
import type { Principal } from '../auth/principal.js';
import { DEFAULT_APP_NAME } from '../conversations/conversation-creation.service.js';
import { ConversationService } from '../conversations/conversation.service.js';
import { DATA_LIFECYCLE_STORE } from '../tokens.js';
import { ErasureRunner } from './erasure.runner.js';
import type { NdjsonSink } from './ndjson-response.js';

/** Conversations listed per page of a user's export. */
const EXPORT_LISTING = 100;

/** A function any feature calls to audit an action (webhook retries, …). */
export type AuditRecorder = (principal: Principal, action: string, target: string) => Promise<void>;

@Injectable()
export class UserDataService {
  constructor(
    @Inject(DATA_LIFECYCLE_STORE) private readonly lifecycle: DataLifecycleStore,
    private readonly conversations: ConversationService,
    private readonly runner: ErasureRunner,
  ) {}

  /** The user a path names, if the caller may act on it; `NOT_FOUND` otherwise. */
  private subject(principal: Principal, userParam: string): string {
    const userId = userParam === 'me' ? principal.userId : userParam;
    if (userId !== principal.userId && !principal.isAdmin) throw new NotFoundError();
    return userId;
  }

  /**
   * `DELETE /api/users/:user_id`: a stored erasure (audited in its
   * transaction), leased to this process and started here at once; the
   * running one when there is one (whoever runs it goes on).
   */
  async erase(principal: Principal, userParam: string): Promise<{ erasure_id: string }> {
    const userId = this.subject(principal, userParam);
    const { erasure, created } = await this.lifecycle.startErasure(
      principal.tenantId,
      userId,
      { actor: principal.userId, action: 'user.erase' },
      new Date(),
      this.runner.newLease(),
    );
    if (created) this.runner.adopt(erasure);
    return { erasure_id: erasure.id };
  }

  /**
   * `GET /api/erasures/:id`: for any caller of the tenant who holds the id (an
   * unguessable UUID; once done the erasure names nobody, so the erased user
   * can still follow it).
   */
  async erasure(principal: Principal, erasureId: string): Promise<ErasureStatusView> {
    const erasure = await this.lifecycle.getErasure(principal.tenantId, erasureId);
    if (!erasure) throw new NotFoundError();
    return { status: erasure.status, conversations_deleted: erasure.conversationsDeleted };
  }

  /**
   * `GET /api/users/:user_id/export`: every conversation of the user as its
   * export, in id order, then `{ user_state }` (its `user:` keys, prefixed as
   * `GET …/state` shows them). Audited before the first line.
   */
  async exportUser(principal: Principal, userParam: string, sink: NdjsonSink): Promise<number> {
    const userId = this.subject(principal, userParam);
    await this.record(principal, 'user.export', `user:${userId}`);
    let afterId: string | undefined;
    let events = 0;
    for (;;) {
      const page = await this.lifecycle.userConversations(
        principal.tenantId,
        userId,
        EXPORT_LISTING,
        afterId,
      );
      for (const ref of page) {
        try {
          events += await this.conversations.exportOne(ref.tenantId, ref.conversationId, sink);
        } catch (error) {
          // Deleted since it was listed, before its first line: not the user's any more.
          if (!(error instanceof NotFoundError)) throw error;
        }
      }
      const last = page[page.length - 1];
      if (!last || page.length < EXPORT_LISTING) break;
      afterId = last.conversationId;
    }
    const state = await this.lifecycle.getUserState(principal.tenantId, DEFAULT_APP_NAME, userId);
    const userState = Object.fromEntries(
      Object.entries(state).map(([key, value]) => [`user:${key}`, value]),
    );
    await sink.write([{ user_state: userState }]);
    return events;
  }

  /** `GET /api/audit`: the tenant's records, newest first; admins only. */
  async audit(principal: Principal, query: AuditQuery): Promise<AuditPageView> {
    if (!principal.isAdmin) throw new NotFoundError();
    const page = await this.lifecycle.listAudit(principal.tenantId, query.limit, query.page_id);
    return {
      results: page.records.map((record) => ({
        id: record.id,
        time: record.time.toISOString(),
        actor: record.actor,
        action: record.action,
        target: record.target,
      })),
      next_page_id: page.nextCursor,
    };
  }

  /**
   * Audits an action of `principal` on `target`, in a transaction of its own:
   * for actions with no transaction of theirs (an export, a webhook retry).
   */
  readonly record: AuditRecorder = (principal, action, target) =>
    this.lifecycle.recordAudit(
      { tenantId: principal.tenantId, actor: principal.userId, action, target },
      new Date(),
    );
}

/**
 * What a session knows of its conversation, read by its parts as they go:
 * the row it started from (its settings read again after a PATCH), the
 * state its agent sees, and this session's `loading` event. Nothing here
 * writes to the store.
 */
import type { MultitaskStrategy } from '@cs/protocol';
import {
  DEFAULT_SETTINGS,
  effectiveMultitaskStrategy,
  type ConversationRecord,
} from '../conversation.js';
import type { ConversationSnapshot, ConversationStore } from '../ports/conversation-store.port.js';
import { SessionState } from './session-state.js';

export class SessionConversation {
  /** The state its agent sees, kept in step with the session's writes. */
  readonly state = new SessionState();
  private row: ConversationRecord | null = null;
  /** A PATCH changed the settings since `row` was read (`settingsChanged`). */
  private settingsStale = false;
  private loadingId = -1;

  constructor(
    private readonly store: ConversationStore,
    /** The deployment's `MULTITASK_STRATEGY` (a conversation's own wins). */
    private readonly deploymentStrategy: MultitaskStrategy | undefined,
    private readonly reportError: (message: string, error: unknown) => void,
  ) {}

  /** The row as the session started from it (settings as last read); null before. */
  get record(): ConversationRecord | null {
    return this.row;
  }

  /** Id of this session's `loading` event: what was stored before it, a new holder resumes; -1 before. */
  get loadingEventId(): number {
    return this.loadingId;
  }

  /** What a message sent while a turn runs does (the conversation's, else the deployment's). */
  get strategy(): MultitaskStrategy {
    return effectiveMultitaskStrategy(
      this.row?.settings ?? DEFAULT_SETTINGS,
      this.deploymentStrategy,
    );
  }

  /** Its `confirmation_mode` as last read (a PATCH applies from the next step on). */
  get confirmationMode(): boolean {
    return this.row?.settings.confirmationMode ?? false;
  }

  get instructions(): string | null {
    return this.row?.instructions ?? null;
  }

  /** The row and state read at start, before anything is stored. */
  restore(snapshot: ConversationSnapshot): void {
    this.row = snapshot.conversation;
    this.state.load(snapshot.state);
  }

  /** This session's `loading` event was stored (-1: none came back). */
  loaded(loadingEventId: number): void {
    this.loadingId = loadingEventId;
  }

  /** A PATCH changed the settings: read again before the next decision that uses them. */
  settingsChanged(): void {
    this.settingsStale = true;
  }

  /**
   * After `settingsChanged`: the settings as stored now. A failed read leaves
   * them as they were, to be read again at the next decision; never rejects.
   */
  async refreshSettings(): Promise<void> {
    const record = this.row;
    if (!record || !this.settingsStale) return;
    this.settingsStale = false;
    try {
      const fresh = await this.store.getConversation(record.tenantId, record.id);
      if (fresh && fresh.incarnation === record.incarnation && this.row === record) {
        this.row = { ...record, settings: fresh.settings };
      }
    } catch (error) {
      this.settingsStale = true;
      this.reportError("could not read the conversation's settings again", error);
    }
  }

  /**
   * Before a step: the settings as above, and the `app:` and `user:` keys
   * read again if another conversation changed them. A failed read leaves
   * the state as it was, to be read at the next step; never rejects.
   */
  async refreshSharedState(): Promise<void> {
    await this.refreshSettings();
    const record = this.row;
    if (!record || !this.state.isStale) return;
    try {
      await this.state.refresh(() =>
        this.store.getScopedState(record.tenantId, record.appName, record.userId),
      );
    } catch (error) {
      this.reportError('could not read the user: and app: state again', error);
    }
  }
}

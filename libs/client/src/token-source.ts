/** Where a token comes from: given once, and/or fetched again by `getToken`. */
export type TokenProvider = () => string | Promise<string>;

/**
 * The client's current bearer token. `refresh(stale)` asks `getToken` for a
 * new one unless someone already replaced `stale`, and callers that refresh at
 * once share one call.
 */
export class TokenSource {
  private token: string | undefined;
  private refreshing: Promise<string | undefined> | undefined;

  constructor(
    token: string | undefined,
    private readonly getToken: TokenProvider | undefined,
  ) {
    this.token = token;
  }

  get canRefresh(): boolean {
    return this.getToken !== undefined;
  }

  /** The token to use now (asks `getToken` when there is none yet). */
  current(): Promise<string | undefined> {
    if (this.token === undefined && this.getToken) return this.refresh(undefined);
    return Promise.resolve(this.token);
  }

  refresh(stale: string | undefined): Promise<string | undefined> {
    const getToken = this.getToken;
    if (!getToken || this.token !== stale) return Promise.resolve(this.token);
    this.refreshing ??= (async () => {
      try {
        this.token = await getToken();
        return this.token;
      } finally {
        this.refreshing = undefined;
      }
    })();
    return this.refreshing;
  }
}

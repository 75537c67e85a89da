/**
 * An `application/x-ndjson` answer written as it is read: one JSON value per
 * line, each chunk waiting until the client took the one before (the
 * socket's buffer drained), so that an export of any size holds one page in
 * memory at a time, whatever the client's speed. While it waits it holds
 * none of the values it wrote, only their text: a page's objects kept across
 * a slow client's wait, while other work allocates, would outlive two young
 * collections and be promoted to the old generation, ~1.5 MB a page kept
 * until a full collection.
 */
import type { Response } from 'express';
import { firstOf } from '../realtime/live-connection.js';

/** What an export writes its lines to. */
export interface NdjsonSink {
  /**
   * Writes the values, one line each, at once, and keeps none of them;
   * resolves once the client has taken them. A caller that lets go of the
   * values before it awaits holds nothing of them while the client is behind.
   */
  write(values: readonly unknown[]): Promise<void>;
}

/** The client went away: the export stops. */
export class ClientGoneError extends Error {
  constructor() {
    super('the client closed the connection');
  }
}

/** The headers go with the first line: a failure before it is an ordinary error answer. */
export function ndjsonResponse(response: Response): NdjsonSink {
  const gone = () => response.destroyed || response.writableEnded || !response.socket;
  const stillThere = () => {
    if (gone()) throw new ClientGoneError();
  };
  /** Sends the lines; whether the socket took them at once. */
  const send = (values: readonly unknown[]): boolean => {
    stillThere();
    if (!response.headersSent) {
      response.status(200).set({
        'content-type': 'application/x-ndjson; charset=utf-8',
        'cache-control': 'no-store',
        'x-accel-buffering': 'no',
      });
    }
    let chunk = '';
    for (const value of values) chunk += `${JSON.stringify(value)}\n`;
    return response.write(chunk);
  };
  return {
    // Not an `async` function: its suspended frame would hold `values`.
    write(values) {
      if (values.length === 0) return Promise.resolve();
      try {
        if (send(values)) return Promise.resolve().then(stillThere);
      } catch (error) {
        return Promise.reject(error instanceof Error ? error : new Error(String(error)));
      }
      return firstOf(response, ['drain', 'close']).then(stillThere);
    },
  };
}

/**
 * Runs an export into `response`: ended once `run` is done; cut (destroyed)
 * when it fails after the first line, so that the client sees an export
 * without its last line rather than a whole-looking one. A failure before
 * the first line is thrown, for the usual error answer.
 */
export async function streamNdjson(
  response: Response,
  run: (sink: NdjsonSink) => Promise<void>,
  onCutShort: (error: unknown) => void = () => undefined,
): Promise<void> {
  const sink = ndjsonResponse(response);
  try {
    await run(sink);
    response.end();
  } catch (error) {
    if (!response.headersSent && !(error instanceof ClientGoneError)) throw error;
    response.destroy();
    if (!(error instanceof ClientGoneError)) onCutShort(error);
  }
}

/** Logs an export cut short by a failure after its first line. */
export function cutShort(logger: { warn(message: string): unknown }): (error: unknown) => void {
  return (error) => logger.warn(`export cut short: ${String(error)}`);
}

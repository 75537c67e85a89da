/**
 * The dependency checks behind `/readyz` (gateway, standalone, worker). A
 * check that does not answer within the timeout counts as unreachable, so a
 * hung Redis or Postgres makes the probe say 503 in time rather than hang it;
 * a check still pending is not started again, so probes do not pile up
 * behind a dependency that hangs.
 */

/** A dependency check: resolves when reachable, throws otherwise. */
export type ReadinessCheck = { name: string; check: () => Promise<void> };

/** Well under the probes' timeout (3 s in deploy/k8s). */
export const READINESS_TIMEOUT_MS = 1_500;

/** The names of the checks that failed or timed out (empty: ready). */
export async function unreachableDependencies(
  checks: readonly ReadinessCheck[],
  timeoutMs = READINESS_TIMEOUT_MS,
): Promise<string[]> {
  const results = await Promise.all(
    checks.map(async ({ name, check }) => ((await passes(check, timeoutMs)) ? null : name)),
  );
  return results.filter((name): name is string => name !== null);
}

async function passes(check: () => Promise<void>, timeoutMs: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<false>((resolve) => {
    timer = setTimeout(() => resolve(false), timeoutMs);
  });
  try {
    return await Promise.race([
      Promise.resolve()
        .then(check)
        .then(
          () => true,
          () => false,
        ),
      timeout,
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/** A check that shares its pending run with the probes that come meanwhile. */
export function singleFlight(check: () => Promise<void>): () => Promise<void> {
  let pending: Promise<void> | undefined;
  return () => {
    pending ??= check().finally(() => {
      pending = undefined;
    });
    return pending;
  };
}

/** Postgres answers `select 1`. */
export function databaseCheck(database: { query(sql: string): Promise<unknown> }): ReadinessCheck {
  return {
    name: 'database',
    check: singleFlight(async () => void (await database.query('select 1'))),
  };
}

/**
 * Redis is connected and answers PING. A connection that is not `ready`
 * fails at once: its commands would wait in the offline queue until it is.
 */
export function redisCheck(
  redis: { status: string; ping(): Promise<unknown> },
  name = 'redis',
): ReadinessCheck {
  return {
    name,
    check: singleFlight(async () => {
      if (redis.status !== 'ready') throw new Error(`redis is ${redis.status}`);
      await redis.ping();
    }),
  };
}

/**
 * The one start-up and shutdown path of every process (docs/protocol.md
 * "Commands"): the configuration read once, the logger made from it, then the
 * app started; the first SIGTERM or SIGINT drains it, repeats are ignored.
 * Exit codes: 0 after a drain that finished, 1 when the start failed, the
 * drain failed or it outlived its deadline. A one-shot task (`runTask`) exits
 * 0 when it succeeded and 1 otherwise.
 */
import { StartupError, loadConfigOrExit, type AppConfig, type ProcessRole } from '@cs/config';
import { createServiceLogger, stopTracing, type ServiceLogger } from '@cs/observability';

export interface ServiceContext {
  config: AppConfig;
  /** The process's logger (LOG_LEVEL, LOG_FORMAT), tagged with its role. */
  logger: ServiceLogger;
}

/** What a started app gives back: how it drains. */
export interface RunningService {
  /**
   * Stops taking work and lets go of it (readiness 503, sockets closed,
   * leases handed back), then closes connections and stores.
   */
  drain(): Promise<void>;
  /** The logger for shutdown lines (with the process's id); the root one by default. */
  logger?: ServiceLogger;
}

/**
 * How long a process that holds clients' sockets (a gateway, the standalone
 * app) drains after SIGTERM: within the 10 s the contract gives it to exit.
 */
export const CLIENT_DRAIN_TIMEOUT_MS = 9_000;

export interface ServiceOptions {
  role: Exclude<ProcessRole, 'tool'>;
  /** Past this the drain is abandoned and the process exits with 1. */
  drainTimeoutMs: number;
}

type Exit = (code: number) => never;

/** Starts a long-running app (gateway, worker, standalone) and drains it on the first signal. */
export function runService(
  options: ServiceOptions,
  start: (context: ServiceContext) => Promise<RunningService>,
  exit: Exit = (code) => process.exit(code),
): void {
  const config = loadConfigOrExit(options.role);
  const root = createServiceLogger({ ...config.log, role: options.role });
  reportCrashes(root, exit);
  let running: RunningService | undefined;
  let stopping = false;

  const drain = (signal: NodeJS.Signals) => {
    const logger = running?.logger ?? root;
    if (stopping) {
      logger.info(`${signal} again: already draining`);
      return;
    }
    stopping = true;
    if (running) drainRunning(running, signal, logger);
    else {
      logger.info(`${signal} while starting: exiting`);
      exit(0);
    }
  };
  const drainRunning = (service: RunningService, signal: string, logger: ServiceLogger) => {
    logger.info(`${signal}: draining`);
    const started = Date.now();
    const deadline = setTimeout(() => {
      logger.error(`drain timed out after ${options.drainTimeoutMs} ms; exiting`);
      exit(1);
    }, options.drainTimeoutMs);
    deadline.unref();
    service.drain().then(
      async () => {
        logger.info(`drained in ${Date.now() - started} ms`);
        await stopTracing().catch(() => undefined);
        exit(0);
      },
      (error: unknown) => {
        logger.error({ err: error }, `drain failed: ${describe(error)}`);
        exit(1);
      },
    );
  };
  process.on('SIGTERM', drain);
  process.on('SIGINT', drain);

  start({ config, logger: root }).then(
    (service) => {
      running = service;
    },
    (error: unknown) => {
      // An operator's mistake is told in its one line; anything else with its stack.
      const fields = error instanceof StartupError ? {} : { err: error };
      root.fatal(fields, `${options.role} failed to start: ${describe(error)}`);
      exit(1);
    },
  );
}

/** Runs a one-shot command (`npm run db:migrate`) and exits with its outcome. */
export function runTask(
  name: string,
  task: (context: ServiceContext) => Promise<void>,
  exit: Exit = (code) => process.exit(code),
): void {
  const config = loadConfigOrExit('tool');
  const logger = createServiceLogger({ ...config.log, role: name });
  reportCrashes(logger, exit);
  task({ config, logger }).then(
    () => exit(0),
    (error: unknown) => {
      logger.fatal({ err: error }, `${name} failed: ${describe(error)}`);
      exit(1);
    },
  );
}

/** An error nobody caught ends the process, as Node would, but as a log line. */
function reportCrashes(logger: ServiceLogger, exit: Exit): void {
  const crash = (error: unknown) => {
    logger.fatal({ err: error }, `crashed: ${describe(error)}`);
    exit(1);
  };
  process.on('uncaughtException', crash);
  process.on('unhandledRejection', crash);
}

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

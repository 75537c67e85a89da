// The image's HEALTHCHECK. The container runs one process: a gateway or the
// standalone service answers `/healthz` on PORT, a worker on WORKER_HTTP_PORT;
// the process is healthy when either answers 200. (A deploy script, not app
// code: it reads the two ports from the environment itself, with the
// defaults of libs/config.)
const ports = [process.env.PORT || '3000', process.env.WORKER_HTTP_PORT || '3001'];
const signal = AbortSignal.timeout(2_500);
const answers = await Promise.allSettled(
  ports.map((port) => fetch(`http://127.0.0.1:${port}/healthz`, { signal })),
);
process.exit(answers.some((a) => a.status === 'fulfilled' && a.value.ok) ? 0 : 1);

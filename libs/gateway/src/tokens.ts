/** Injection tokens of the gateway's ports, provided by the app that hosts it. */
export const APP_CONFIG = Symbol('APP_CONFIG');
export const CONVERSATION_STORE = Symbol('CONVERSATION_STORE');
/** Retention, erasures and the audit trail (`DataLifecycleStore`). */
export const DATA_LIFECYCLE_STORE = Symbol('DATA_LIFECYCLE_STORE');
export const CONVERSATION_MANAGER = Symbol('CONVERSATION_MANAGER');
export const USER_ACTION_RATE_LIMITER = Symbol('USER_ACTION_RATE_LIMITER');
export const READINESS_CHECKS = Symbol('READINESS_CHECKS');
export const AGENT_FACTORY = Symbol('AGENT_FACTORY');
/** Optional: where a cluster gateway's rooms get their live traffic (`RoomTrafficSource`). */
export const ROOM_TRAFFIC_SOURCE = Symbol('ROOM_TRAFFIC_SOURCE');
/**
 * Optional: where the gateway tells a conversation's room something (a
 * deletion) in a cluster (the Redis broadcaster); the local room hub otherwise.
 */
export const ROOM_BROADCASTER = Symbol('ROOM_BROADCASTER');
/**
 * Optional: throws (`UNAVAILABLE`) while the Socket.IO adapter cannot reach
 * the other gateways (a cluster gateway's adapter connections to Redis are
 * down), so that a question to every gateway is refused at once.
 */
export const SOCKET_ADAPTER_CHECK = Symbol('SOCKET_ADAPTER_CHECK');
/** Optional: the webhook outbox (`WebhookOutbox`) behind `/api/webhook-deliveries`. */
export const WEBHOOK_OUTBOX = Symbol('WEBHOOK_OUTBOX');
/**
 * Optional: gives retention's sweep to one process of the deployment per
 * interval (`PeriodLock`; a Redis key in a cluster). Without it the process
 * is the only one (standalone).
 */
export const RETENTION_LOCK = Symbol('RETENTION_LOCK');
/**
 * Optional: forgets what Redis holds of a user and of their conversations
 * (`UserKeyEraser`; a cluster's). Without it there is no Redis (standalone).
 */
export const USER_KEY_ERASER = Symbol('USER_KEY_ERASER');

// The sharded Redis channel of a conversation's room, as the service names it
// (libs/cluster ClusterKeys.conversationRoom: the conversation's hash tag,
// then its id and incarnation), for the bench's own subscribers.

/** Reads the conversation's incarnation from the bench cluster's database. */
export async function roomChannel(cluster, conversationId) {
  const { rows } = await cluster.db.query('SELECT incarnation FROM conversations WHERE id = $1', [
    conversationId,
  ]);
  if (!rows[0]) throw new Error(`no conversation ${conversationId}`);
  const room = `${conversationId}.${rows[0].incarnation}`;
  return `${cluster.keyPrefix}:room:{${conversationId}}:${room}`;
}

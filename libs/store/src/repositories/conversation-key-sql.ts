/**
 * The condition of a statement about one conversation, as SQL: the tenant in
 * `$1`, the id in `$2` (`alias` qualifies the columns).
 *
 * `tenant_id IS NOT DISTINCT FROM $1` selects the same rows as `=` (tenant_id
 * is never null) but is a condition no index takes, so that the primary key is
 * the planner's only way in. With `=`, the generic plan a pooled connection
 * keeps for a prepared statement, when built while the table was small and
 * never analyzed (a new deployment; a Postgres without autovacuum), went
 * through the owner index (tenant_id, user_id) instead, and every append of
 * that connection read all the tenant's conversations
 * (test/integration/prepared-plans.int-spec.ts).
 */
export function oneConversation(alias?: string): string {
  const column = (name: string) => (alias ? `${alias}.${name}` : name);
  return `${column('id')} = $2 AND ${column('tenant_id')} IS NOT DISTINCT FROM $1`;
}

/**
 * The conversation's `metrics` plus four counters, as SQL: the parameters
 * `$<first>` … `$<first + 3>` are iterations, prompt tokens, completion
 * tokens and cost, in that order. One definition for the appends and the
 * updates that add usage.
 */
export function metricsPlus(first: number): string {
  const add = (name: string, offset: number) =>
    `'${name}', coalesce((metrics ->> '${name}')::numeric, 0) + $${first + offset}::numeric`;
  return `jsonb_build_object(${[
    add('iterations', 0),
    add('prompt_tokens', 1),
    add('completion_tokens', 2),
    add('cost_usd', 3),
  ].join(', ')})`;
}

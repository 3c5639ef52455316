-- One claim of 64 and its completion, the statements mailroom runs
-- (sql/claims.rs CLAIM_ANY walking the whole topic, sql/completions.rs
-- COMPLETE_MANY with its queue rows and history rows), for pgbench:
-- ceiling.sh.
WITH picked AS (
    UPDATE mailroom.queue q SET state = 'running'
    WHERE q.seq = ANY(ARRAY(
        SELECT c.seq FROM mailroom.queue c
        WHERE c.topic = ANY(ARRAY['t']) AND c.state = 'pending' AND c.run_at <= now()
        ORDER BY c.topic, -c.priority, c.seq LIMIT 64 FOR UPDATE SKIP LOCKED))
    RETURNING q.seq, q.priority
), c AS (
    UPDATE mailroom.events e
    SET status = 'running', attempts = e.attempts + 1,
        lease_until = now() + 30000000 * interval '1 microsecond',
        started_at = now(), worker = 'w' || :client_id, next_attempt_at = NULL
    WHERE e.seq = ANY(ARRAY(SELECT seq FROM picked))
    RETURNING e.seq, e.id::text, e.source, e.topic, e.dedup_key, e.key, e.type,
              e.status, e.attempts, e.payload)
SELECT array_agg(id)::text AS ids, array_agg(attempts)::text AS toks FROM c
\gset
WITH input AS (
    SELECT * FROM UNNEST(:ids::text[], :toks::int8[]) WITH ORDINALITY AS t(id, token, ord)
), ended AS (
    UPDATE mailroom.events e
    SET status = 'done', next_attempt_at = NULL, lease_until = NULL,
        last_error = e.last_error
    FROM input i
    WHERE e.id = i.id::uuid AND e.status = 'running' AND e.attempts = i.token
    RETURNING e.seq, e.started_at, e.worker, i.ord, i.token
), dequeued AS (
    DELETE FROM mailroom.queue q USING ended x WHERE q.seq = x.seq
), recorded AS (
    INSERT INTO mailroom.attempts (event_seq, attempt, started_at, finished_at, outcome, error, worker)
    SELECT seq, token, started_at, now(), 'done', NULL, worker FROM ended
    ON CONFLICT DO NOTHING
)
SELECT ord FROM ended;

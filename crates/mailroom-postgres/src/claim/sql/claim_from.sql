WITH picked AS (UPDATE mailroom.queue q SET state = 'running'
             WHERE q.seq = ANY(ARRAY(WITH due_higher AS (
         SELECT h.seq FROM mailroom.queue h
         WHERE h.topic = ANY(ARRAY[$3::text]) AND h.state = 'pending'
           AND -h.priority < -$7 AND h.run_at <= now() AND ($5::int8 IS NULL OR h.ready_at > now() - $5 * interval '1 microsecond') ORDER BY h.topic, -h.priority, h.seq LIMIT $4 FOR UPDATE SKIP LOCKED
     ), due_pending AS (
         SELECT c.seq FROM mailroom.queue c
         WHERE c.topic = ANY(ARRAY[$3::text]) AND c.state = 'pending'
           AND c.run_at <= now() AND ($5::int8 IS NULL OR c.ready_at > now() - $5 * interval '1 microsecond') AND (c.topic, -c.priority, c.seq) >= ($3, -$7, $6)
         ORDER BY c.topic, -c.priority, c.seq
         LIMIT $4 - (SELECT count(*) FROM due_higher) FOR UPDATE SKIP LOCKED
     )
     SELECT seq FROM due_higher UNION ALL SELECT seq FROM due_pending)) RETURNING q.seq, q.priority), claimed AS (
                 UPDATE mailroom.events e
                 SET status = 'running', attempts = e.attempts + 1,
                     lease_until = statement_timestamp() + $1 * interval '1 microsecond',
                     started_at = statement_timestamp(), worker = $2, next_attempt_at = NULL
                 WHERE e.seq = ANY(ARRAY(SELECT seq FROM picked))
                 RETURNING e.*
             ) SELECT e.seq, e.id::text, e.source, e.topic, e.dedup_key, e.key, e.type, e.status, e.attempts, e.max_attempts, (extract(epoch FROM e.next_attempt_at) * 1000000)::int8, (extract(epoch FROM e.received_at) * 1000000)::int8, e.correlation_id, e.causation_id, e.content_type, e.payload, e.last_error, (extract(epoch FROM e.lease_until) * 1000000)::int8, e.traceparent, e.priority, e.version, p.priority FROM claimed e JOIN picked p ON p.seq = e.seq
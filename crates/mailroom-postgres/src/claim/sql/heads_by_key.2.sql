
                     ORDER BY f.topic, f.key, f.seq LIMIT 1) h
                 WHERE h.state = 'pending'
                   AND NOT EXISTS (SELECT 1 FROM mailroom.queue r
                       WHERE r.topic = $1 AND r.key = keys.key AND r.state = 'running')
             ), picked AS (UPDATE mailroom.queue e SET state = 'running'
                 WHERE e.seq = ANY(ARRAY(SELECT h.seq FROM heads h WHERE h.run_at <= now() AND ($3::int8 IS NULL OR h.ready_at > now() - $3 * interval '1 microsecond') ORDER BY h.seq LIMIT $2)) AND COALESCE(e.state, '') = 'pending' RETURNING e.seq, e.priority), claimed AS (
                 UPDATE mailroom.events e
                 SET status = 'running', attempts = e.attempts + 1,
                     lease_until = statement_timestamp() + $4 * interval '1 microsecond',
                     started_at = statement_timestamp(), worker = $5, next_attempt_at = NULL
                 WHERE e.seq = ANY(ARRAY(SELECT seq FROM picked))
                 RETURNING e.*
             ) SELECT e.seq, e.id::text, e.source, e.topic, e.dedup_key, e.key, e.type, e.status, e.attempts, e.max_attempts, (extract(epoch FROM e.next_attempt_at) * 1000000)::int8, (extract(epoch FROM e.received_at) * 1000000)::int8, e.correlation_id, e.causation_id, e.content_type, e.payload, e.last_error, (extract(epoch FROM e.lease_until) * 1000000)::int8, e.traceparent, e.priority, e.version, p.priority FROM claimed e JOIN picked p ON p.seq = e.seq
)) AND (e.key IS NULL OR NOT EXISTS (SELECT 1 FROM mailroom.queue r
             WHERE r.topic = e.topic AND r.key = e.key AND r.state = 'running'))
                 LIMIT $2
             ), picked AS (UPDATE mailroom.queue e SET state = 'running'
                 WHERE e.seq = ANY(ARRAY(SELECT c.seq FROM candidates c)) AND COALESCE(e.state, '') = 'pending' RETURNING e.seq, e.priority), claimed AS (
                 UPDATE mailroom.events e
                 SET status = 'running', attempts = e.attempts + 1,
                     lease_until = statement_timestamp() + $5 * interval '1 microsecond',
                     started_at = statement_timestamp(), worker = $6, next_attempt_at = NULL
                 WHERE e.seq = ANY(ARRAY(SELECT seq FROM picked))
                 RETURNING e.*
             ), flags AS (
                 SELECT CASE WHEN (SELECT count(*) FROM candidates) < $2
                             THEN (SELECT count(*) FROM (SELECT w.seq, w.topic, w.key, w.run_at, w.ready_at FROM mailroom.queue w
             WHERE w.topic = ANY(ARRAY[$1::text]) AND w.state = 'pending'
             ORDER BY w.topic, -w.priority, w.seq LIMIT $3) n) >= $3
                             ELSE false END AS cut_short,
                        EXISTS (SELECT 1 FROM promoted) AS promoted,
                        EXISTS (SELECT 1 FROM pg_locks l
                 WHERE l.locktype = 'advisory' AND l.classid = 1836213108::oid
                   AND l.objid = hashtext($1)::oid AND l.objsubid = 2 AND NOT l.granted) AS contended
             )
             SELECT c.*, f.cut_short, f.promoted, f.contended
             FROM flags f LEFT JOIN (SELECT e.seq, e.id::text, e.source, e.topic, e.dedup_key, e.key, e.type, e.status, e.attempts, e.max_attempts, (extract(epoch FROM e.next_attempt_at) * 1000000)::int8, (extract(epoch FROM e.received_at) * 1000000)::int8, e.correlation_id, e.causation_id, e.content_type, e.payload, e.last_error, (extract(epoch FROM e.lease_until) * 1000000)::int8, e.traceparent, e.priority, e.version, p.priority FROM claimed e JOIN picked p ON p.seq = e.seq) c ON true
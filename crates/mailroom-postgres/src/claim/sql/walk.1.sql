WITH promoted AS (UPDATE mailroom.queue s SET state = 'pending'
         WHERE s.seq = ANY(ARRAY(
             SELECT d.seq FROM mailroom.queue d
             WHERE d.topic = ANY(ARRAY[$1::text]) AND d.state = 'scheduled' AND d.run_at <= now()
             ORDER BY d.topic, d.run_at LIMIT 1000 FOR UPDATE SKIP LOCKED))
           AND s.state = 'scheduled' RETURNING s.seq
             ), candidates AS MATERIALIZED (
                 SELECT e.seq FROM (SELECT w.seq, w.topic, w.key, w.run_at, w.ready_at FROM mailroom.queue w
             WHERE w.topic = ANY(ARRAY[$1::text]) AND w.state = 'pending'
             ORDER BY w.topic, -w.priority, w.seq LIMIT $3) e
                 WHERE e.run_at <= now() AND ($4::int8 IS NULL OR e.ready_at > now() - $4 * interval '1 microsecond') AND (e.key IS NULL OR NOT EXISTS (SELECT 1 FROM mailroom.queue p
                 WHERE p.topic = e.topic AND p.key = e.key AND p.key IS NOT NULL
                   AND p.state <> 'running' AND p.seq < e.seq
SELECT CASE WHEN EXISTS (SELECT 1 FROM (SELECT w.seq, w.topic, w.key, w.run_at, w.ready_at FROM mailroom.queue w
             WHERE w.topic = ANY(ARRAY[$1::text]) AND w.state = 'pending'
             ORDER BY w.topic, -w.priority, w.seq LIMIT $2) e
               WHERE e.run_at <= now() AND ($3::int8 IS NULL OR e.ready_at > now() - $3 * interval '1 microsecond') AND (e.key IS NULL OR NOT EXISTS (SELECT 1 FROM mailroom.queue p
                 WHERE p.topic = e.topic AND p.key = e.key AND p.key IS NOT NULL
                   AND p.state <> 'running' AND p.seq < e.seq

                     ORDER BY f.topic, f.key, f.seq LIMIT 1) h
                 WHERE h.state = 'pending'
                   AND NOT EXISTS (SELECT 1 FROM mailroom.queue r
                       WHERE r.topic = $1 AND r.key = keys.key AND r.state = 'running')
             ) SELECT (extract(epoch FROM MIN(t.due)) * 1000000)::int8 FROM (
                 SELECT heads.run_at AS due FROM heads WHERE ($3::int8 IS NULL OR heads.ready_at > now() - $3 * interval '1 microsecond')
                 UNION ALL
                 SELECT w.run_at FROM (SELECT w.seq, w.topic, w.key, w.run_at, w.ready_at FROM mailroom.queue w
             WHERE w.topic = ANY(ARRAY[$1::text]) AND w.state = 'pending'
             ORDER BY w.topic, -w.priority, w.seq LIMIT $2) w
                 WHERE w.key IS NULL AND ($3::int8 IS NULL OR w.ready_at > now() - $3 * interval '1 microsecond')
                 UNION ALL
                 SELECT s.run_at FROM (
                     SELECT d.run_at FROM mailroom.queue d
                     WHERE d.topic = ANY(ARRAY[$1::text]) AND d.state = 'scheduled'
                     ORDER BY d.topic, d.run_at LIMIT 1) s) t
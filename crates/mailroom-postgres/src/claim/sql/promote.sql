UPDATE mailroom.queue s SET state = 'pending'
         WHERE s.seq = ANY(ARRAY(
             SELECT d.seq FROM mailroom.queue d
             WHERE d.topic = ANY(ARRAY[$1::text]) AND d.state = 'scheduled' AND d.run_at <= now()
             ORDER BY d.topic, d.run_at LIMIT 1000 FOR UPDATE SKIP LOCKED))
           AND s.state = 'scheduled'
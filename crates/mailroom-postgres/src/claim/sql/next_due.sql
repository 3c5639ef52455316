SELECT (extract(epoch FROM LEAST(
         (SELECT MIN(e.run_at) FROM mailroom.queue e
          WHERE e.topic = $1 AND e.state = 'pending' AND ($2::int8 IS NULL OR e.ready_at > now() - $2 * interval '1 microsecond')),
         (SELECT MIN(s.run_at) FROM mailroom.queue s
          WHERE s.topic = $1 AND s.state = 'scheduled'))) * 1000000)::int8
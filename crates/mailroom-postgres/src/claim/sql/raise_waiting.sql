
    WITH RECURSIVE levels (p, n) AS (
        (SELECT -c.priority, 1 FROM mailroom.queue c
         WHERE c.topic = ANY(ARRAY[$1::text]) AND c.state = 'pending'
         ORDER BY c.topic, -c.priority LIMIT 1)
        UNION ALL
        SELECT nx.p, levels.n + 1 FROM levels CROSS JOIN LATERAL (
            SELECT -c.priority AS p FROM mailroom.queue c
            WHERE c.topic = ANY(ARRAY[$1::text]) AND c.state = 'pending'
              AND -c.priority > levels.p
            ORDER BY c.topic, -c.priority LIMIT 1) nx
        WHERE levels.n < 100
    ), waiting AS (
        SELECT x.seq FROM levels CROSS JOIN LATERAL (
            SELECT w.seq, w.run_at FROM mailroom.queue w
            WHERE w.topic = ANY(ARRAY[$1::text]) AND w.state = 'pending'
              AND -w.priority = levels.p
            ORDER BY w.topic, -w.priority, w.seq LIMIT $3) x
        WHERE levels.n > 1 AND x.run_at <= now() - $2 * interval '1 microsecond'
    ), locked AS (
        SELECT q.seq FROM mailroom.queue q
        WHERE q.seq = ANY(ARRAY(SELECT seq FROM waiting)) AND q.state = 'pending'
        FOR UPDATE SKIP LOCKED
    )
    UPDATE mailroom.queue q SET priority = -(SELECT p FROM levels WHERE n = 1)
    WHERE q.seq = ANY(ARRAY(SELECT seq FROM locked))
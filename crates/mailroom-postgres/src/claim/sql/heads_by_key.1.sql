WITH RECURSIVE keys (key, n) AS (
                 (SELECT k.key, 1 FROM mailroom.queue k
                  WHERE k.topic = ANY(ARRAY[$1::text]) AND k.key IS NOT NULL
                    AND k.state <> 'running'
                  ORDER BY k.topic, k.key LIMIT 1)
                 UNION ALL
                 SELECT next.key, keys.n + 1
                 FROM keys CROSS JOIN LATERAL (
                     SELECT k.key FROM mailroom.queue k
                     WHERE k.topic = ANY(ARRAY[$1::text]) AND k.key > keys.key
                       AND k.key IS NOT NULL AND k.state <> 'running'
                     ORDER BY k.topic, k.key LIMIT 1) next
                 WHERE keys.n < 10000
             ), heads AS (
                 SELECT h.seq, h.key, h.run_at, h.ready_at
                 FROM keys CROSS JOIN LATERAL (
                     SELECT f.seq, f.key, f.state, f.run_at, f.ready_at FROM mailroom.queue f
                     WHERE f.topic = ANY(ARRAY[$1::text]) AND f.key IS NOT NULL
                       AND f.state <> 'running'
                       AND f.key >= keys.key AND f.key <= keys.key
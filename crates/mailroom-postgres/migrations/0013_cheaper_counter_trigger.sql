-- The update trigger of migration 12, cheaper for the drain's two
-- statements. Its join of the old and new rows (which event left
-- which status) is only needed when an attempt ends beside other
-- changes, or an event dies or leaves `dead`. A claim (nothing was
-- running or dead, nothing dies) records the net change per topic and
-- status, which the old and new rows give without a join; a completion
-- that kills nothing (every event was running, none is running or dead
-- now) also records each event as a finished attempt, again from the
-- new rows alone. The trigger's share of the claim and completion
-- statements' time was about 30 % (pg_stat_statements over a `single`
-- drain; docs/src/design/README.md).

    CREATE OR REPLACE FUNCTION mailroom.count_updated() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        IF NOT EXISTS (SELECT 1 FROM new_rows) THEN
            RETURN NULL;
        END IF;
        IF NOT EXISTS (SELECT 1 FROM old_rows WHERE status IN ('running', 'dead'))
           AND NOT EXISTS (SELECT 1 FROM new_rows WHERE status = 'dead') THEN
            INSERT INTO mailroom.count_changes (topic, status, n)
            SELECT topic, status, sum(n) FROM (
                SELECT topic, status, -1 AS n FROM old_rows
                UNION ALL
                SELECT topic, status, 1 FROM new_rows
            ) c GROUP BY 1, 2 HAVING sum(n) <> 0;
            RETURN NULL;
        END IF;
        IF NOT EXISTS (SELECT 1 FROM old_rows WHERE status <> 'running')
           AND NOT EXISTS (SELECT 1 FROM new_rows WHERE status IN ('running', 'dead')) THEN
            WITH counted AS (
                INSERT INTO mailroom.count_changes (topic, status, n)
                SELECT topic, status, sum(n) FROM (
                    SELECT topic, status, -1 AS n FROM old_rows
                    UNION ALL
                    SELECT topic, status, 1 FROM new_rows
                ) c GROUP BY 1, 2 HAVING sum(n) <> 0
            )
            INSERT INTO mailroom.traffic_changes (topic, minute, done, failed)
            SELECT topic, floor(extract(epoch FROM now()) / 60)::int8,
                   count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status <> 'done')
            FROM new_rows GROUP BY topic;
            RETURN NULL;
        END IF;
        WITH changed AS MATERIALIZED (
            SELECT a.seq, a.topic, b.status AS was, a.status AS became
            FROM old_rows b JOIN new_rows a ON a.seq = b.seq
            WHERE a.status <> b.status
        ), counted AS (
            INSERT INTO mailroom.count_changes (topic, status, n)
            SELECT topic, status, sum(n) FROM (
                SELECT topic, was AS status, -1 AS n FROM changed
                UNION ALL
                SELECT topic, became, 1 FROM changed
            ) c GROUP BY 1, 2 HAVING sum(n) <> 0
        ), finished AS (
            INSERT INTO mailroom.traffic_changes (topic, minute, done, failed)
            SELECT topic, floor(extract(epoch FROM now()) / 60)::int8,
                   count(*) FILTER (WHERE became = 'done'), count(*) FILTER (WHERE became <> 'done')
            FROM changed WHERE was = 'running' GROUP BY topic
        ), buried AS (
            INSERT INTO mailroom.dead_letters (seq, topic)
            SELECT seq, topic FROM changed WHERE became = 'dead'
        )
        DELETE FROM mailroom.dead_letters d USING changed c
        WHERE d.seq = c.seq AND c.was = 'dead';
        RETURN NULL;
    END $$;

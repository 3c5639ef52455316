-- The dashboard's numbers without scans (the overview in
-- under 100 ms with 1,000,000 events stored), kept by triggers so they
-- are exact whichever statement changes a status (intake, the outbox
-- function, claims, completions, replay, skip, cancel, expiry, rescue,
-- retention), and cheap for the drain (docs/src/design/README.md, "The
-- dashboard's numbers are kept, not counted"):
-- - Statement-level triggers with transition tables: one trigger call
-- per statement, and the writer and the completer group many events
-- into one statement, so a group commit adds one change row per
-- topic and status it touched, not one per event.
-- - The change rows are only ever inserted (`count_changes`,
-- `traffic_changes`): no row that every instance updates, so
-- completions of several instances never wait on each other for a
-- counter. Readers add them to the folded totals (`counts`,
-- `traffic`) in one snapshot; maintenance folds them every period.
-- - `traffic`: per topic and minute (seconds since the epoch / 60),
-- events received (by `received_at`) and attempts finished, done or
-- failed: an attempt finishes exactly when its event leaves
-- `running`, so that change counts it, in the minute it commits.
-- - `dead_letters`: the dead events, so their page and count walk them
-- only. An index on `events` keyed by status would make every claim
-- and completion of `events` a non-HOT update.
-- - `queue_dead`: the dead heads of keys, for the blocked-key count,
-- which walked the whole queue; only a dying event writes an entry.
-- The triggers come first: creating them locks `events` against
-- writes until this migration commits, so the backfill is exact.

    CREATE TABLE mailroom.counts (
        topic  text   NOT NULL,
        status text   NOT NULL,
        n      bigint NOT NULL,
        PRIMARY KEY (topic, status)
    );
    CREATE TABLE mailroom.count_changes (
        topic  text   NOT NULL,
        status text   NOT NULL,
        n      bigint NOT NULL
    ) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);
    CREATE TABLE mailroom.traffic (
        topic    text   NOT NULL,
        minute   bigint NOT NULL,
        received bigint NOT NULL DEFAULT 0,
        done     bigint NOT NULL DEFAULT 0,
        failed   bigint NOT NULL DEFAULT 0,
        PRIMARY KEY (topic, minute)
    );
    CREATE TABLE mailroom.traffic_changes (
        topic    text   NOT NULL,
        minute   bigint NOT NULL,
        received bigint NOT NULL DEFAULT 0,
        done     bigint NOT NULL DEFAULT 0,
        failed   bigint NOT NULL DEFAULT 0
    ) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);
    CREATE TABLE mailroom.dead_letters (
        seq   bigint PRIMARY KEY,                       -- events.seq
        topic text   NOT NULL
    );
    CREATE INDEX dead_letters_topic ON mailroom.dead_letters (topic, seq);
    CREATE INDEX queue_dead ON mailroom.queue (topic, key, seq) WHERE state = 'dead';

    CREATE FUNCTION mailroom.count_inserted() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        IF NOT EXISTS (SELECT 1 FROM inserted) THEN
            RETURN NULL;
        END IF;
        WITH counted AS (
            INSERT INTO mailroom.count_changes (topic, status, n)
            SELECT topic, status, count(*) FROM inserted GROUP BY 1, 2
        ), buried AS (
            INSERT INTO mailroom.dead_letters (seq, topic)
            SELECT seq, topic FROM inserted WHERE status = 'dead'
        )
        INSERT INTO mailroom.traffic_changes (topic, minute, received)
        SELECT topic, floor(extract(epoch FROM received_at) / 60)::int8, count(*)
        FROM inserted GROUP BY 1, 2;
        RETURN NULL;
    END $$;
    CREATE FUNCTION mailroom.count_updated() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        IF NOT EXISTS (SELECT 1 FROM new_rows) THEN
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
    CREATE FUNCTION mailroom.count_deleted() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        IF NOT EXISTS (SELECT 1 FROM deleted) THEN
            RETURN NULL;
        END IF;
        WITH counted AS (
            INSERT INTO mailroom.count_changes (topic, status, n)
            SELECT topic, status, -count(*) FROM deleted GROUP BY 1, 2
        )
        DELETE FROM mailroom.dead_letters d USING deleted g
        WHERE d.seq = g.seq AND g.status = 'dead';
        RETURN NULL;
    END $$;
    CREATE TRIGGER events_counted AFTER INSERT ON mailroom.events
        REFERENCING NEW TABLE AS inserted
        FOR EACH STATEMENT EXECUTE FUNCTION mailroom.count_inserted();
    CREATE TRIGGER events_recounted AFTER UPDATE ON mailroom.events
        REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
        FOR EACH STATEMENT EXECUTE FUNCTION mailroom.count_updated();
    CREATE TRIGGER events_uncounted AFTER DELETE ON mailroom.events
        REFERENCING OLD TABLE AS deleted
        FOR EACH STATEMENT EXECUTE FUNCTION mailroom.count_deleted();

    INSERT INTO mailroom.counts (topic, status, n)
    SELECT topic, status, count(*) FROM mailroom.events GROUP BY 1, 2;
    INSERT INTO mailroom.traffic (topic, minute, received)
    SELECT topic, floor(extract(epoch FROM received_at) / 60)::int8, count(*)
    FROM mailroom.events WHERE received_at >= now() - interval '2 hours' GROUP BY 1, 2;
    INSERT INTO mailroom.traffic (topic, minute, done, failed)
    SELECT e.topic, floor(extract(epoch FROM a.finished_at) / 60)::int8,
           count(*) FILTER (WHERE a.outcome = 'done'), count(*) FILTER (WHERE a.outcome <> 'done')
    FROM mailroom.attempts a JOIN mailroom.events e ON e.seq = a.event_seq
    WHERE a.finished_at >= now() - interval '2 hours' GROUP BY 1, 2
    ON CONFLICT (topic, minute) DO UPDATE SET done = EXCLUDED.done, failed = EXCLUDED.failed;
    INSERT INTO mailroom.dead_letters (seq, topic)
    SELECT seq, topic FROM mailroom.events WHERE status = 'dead';

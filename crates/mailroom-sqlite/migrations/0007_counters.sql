-- The dashboard's numbers without scans (the overview
-- page in under 100 ms with 1,000,000 events stored). Counting statuses read
-- an index entry per stored event and the traffic chart every event of
-- the last half hour; both now read counters that triggers keep in the
-- transaction of every change (the writer's group commit), so they are
-- exact whichever statement changes a status (claims, completions,
-- replay, skip, cancel, expiry, rescue, retention). SQLite triggers run
-- per row, inside the writer: no other writer waits on them.
-- - `topic_counts`: events per topic and status (backfilled here).
-- - `traffic`: per topic and minute, events received (by
-- `received_at`) and attempts finished, done or failed: an attempt
-- finishes exactly when its event leaves `running`, so the status
-- change counts it, in the minute it happens. Maintenance drops
-- minutes older than the store keeps (`sql::stats::TRAFFIC_KEPT`).
-- - `events_dead`: dead letters across topics (their page and count)
-- without walking every event.

    CREATE TABLE topic_counts (
        topic  TEXT    NOT NULL,
        status TEXT    NOT NULL,
        n      INTEGER NOT NULL,
        PRIMARY KEY (topic, status)
    ) WITHOUT ROWID;
    INSERT INTO topic_counts (topic, status, n)
    SELECT topic, status, COUNT(*) FROM events GROUP BY topic, status;

    CREATE TABLE traffic (
        topic    TEXT    NOT NULL,
        minute   INTEGER NOT NULL,                   -- milliseconds since the epoch / 60,000
        received INTEGER NOT NULL DEFAULT 0,
        done     INTEGER NOT NULL DEFAULT 0,
        failed   INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (topic, minute)
    ) WITHOUT ROWID;
    INSERT INTO traffic (topic, minute, received)
    SELECT topic, received_at / 60000, COUNT(*) FROM events
    WHERE received_at >= (CAST((julianday('now') - 2440587.5) * 1440 AS INTEGER) - 120) * 60000
    GROUP BY 1, 2;
    INSERT INTO traffic (topic, minute, done, failed)
    SELECT e.topic, a.finished_at / 60000, SUM(a.outcome = 'done'), SUM(a.outcome <> 'done')
    FROM attempts a JOIN events e ON e.seq = a.event_seq
    WHERE a.finished_at >= (CAST((julianday('now') - 2440587.5) * 1440 AS INTEGER) - 120) * 60000
    GROUP BY 1, 2
    ON CONFLICT (topic, minute) DO UPDATE SET done = excluded.done, failed = excluded.failed;

    CREATE TRIGGER events_counted AFTER INSERT ON events BEGIN
        INSERT INTO topic_counts (topic, status, n) VALUES (new.topic, new.status, 1)
            ON CONFLICT (topic, status) DO UPDATE SET n = n + 1;
        INSERT INTO traffic (topic, minute, received) VALUES (new.topic, new.received_at / 60000, 1)
            ON CONFLICT (topic, minute) DO UPDATE SET received = received + 1;
    END;
    CREATE TRIGGER events_recounted AFTER UPDATE OF status ON events
    WHEN old.status <> new.status BEGIN
        UPDATE topic_counts SET n = n - 1 WHERE topic = old.topic AND status = old.status;
        INSERT INTO topic_counts (topic, status, n) VALUES (new.topic, new.status, 1)
            ON CONFLICT (topic, status) DO UPDATE SET n = n + 1;
        INSERT INTO traffic (topic, minute, done, failed)
        SELECT new.topic, CAST((julianday('now') - 2440587.5) * 1440 AS INTEGER),
               new.status = 'done', new.status <> 'done'
        WHERE old.status = 'running'
        ON CONFLICT (topic, minute) DO UPDATE
            SET done = done + excluded.done, failed = failed + excluded.failed;
    END;
    CREATE TRIGGER events_uncounted AFTER DELETE ON events BEGIN
        UPDATE topic_counts SET n = n - 1 WHERE topic = old.topic AND status = old.status;
    END;

    CREATE INDEX events_dead ON events (seq) WHERE status = 'dead';

-- Events and their attempt history.

    CREATE TABLE events (
        seq             INTEGER PRIMARY KEY AUTOINCREMENT, -- arrival (= commit) order
        id              TEXT    NOT NULL UNIQUE,           -- UUIDv7
        source          TEXT    NOT NULL,
        topic           TEXT    NOT NULL,
        dedup_key       TEXT    NOT NULL,
        key             TEXT,
        type            TEXT,
        status          TEXT    NOT NULL
                        CHECK (status IN ('pending', 'running', 'done', 'dead', 'skipped')),
        attempts        INTEGER NOT NULL DEFAULT 0,
        max_attempts    INTEGER NOT NULL,
        next_attempt_at INTEGER,                           -- set while pending
        received_at     INTEGER NOT NULL,
        lease_until     INTEGER,                           -- set while running
        started_at      INTEGER,                           -- start of the current/last attempt
        worker          TEXT,                              -- worker of the current/last attempt
        correlation_id  TEXT,
        causation_id    TEXT,
        content_type    TEXT,
        payload         BLOB,                              -- NULL once retention dropped it
        last_error      TEXT,
        UNIQUE (source, dedup_key)
    );
    -- Claims scan one topic's pending events in arrival order.
    CREATE INDEX events_claim ON events (topic, status, seq, next_attempt_at);
    -- Sequential topics: the open events of a key, to find its head.
    CREATE INDEX events_open_keys ON events (topic, key, seq)
        WHERE key IS NOT NULL AND status IN ('pending', 'running', 'dead');
    -- Running events only: lease rescue, and 'is this key busy?'.
    CREATE INDEX events_running ON events (topic, key) WHERE status = 'running';

    CREATE TABLE attempts (
        event_seq   INTEGER NOT NULL,                      -- events.seq
        attempt     INTEGER NOT NULL,                      -- 1-based, keeps counting across replays
        started_at  INTEGER NOT NULL,
        finished_at INTEGER,
        outcome     TEXT    NOT NULL
                    CHECK (outcome IN ('done', 'retry', 'dead', 'lease_expired')),
        error       TEXT,
        worker      TEXT,
        PRIMARY KEY (event_seq, attempt)
    ) WITHOUT ROWID;

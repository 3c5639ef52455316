-- `events_listing` holds finished events only. A running event
-- satisfied its `status <> 'pending'`, so every statement looking for
-- running events (a completion's `status = 'running'`, the head rule's
-- "is one of this key running?") could be planned as a walk of it, over
-- every finished event. Completions were: with statistics taken while
-- the events were pending, the index looked empty, and the cached plan
-- then scanned a growing index on every completion (8 ms per group of
-- 64 after 50,000 events, against 0.8 ms). It also took an entry at
-- every claim that no listing needed. Listings by topic read running
-- events (few: at most the topics' concurrency) through
-- `events_running`.

    DROP INDEX mailroom.events_listing;
    CREATE INDEX events_listing ON mailroom.events (topic, seq)
        WHERE status IN ('done', 'dead', 'skipped');

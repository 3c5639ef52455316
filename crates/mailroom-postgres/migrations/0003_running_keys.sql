-- "is any event of this key running?" (the head rule of sequential
-- topics) as one index seek, instead of walking every open event of the
-- key through the heap: claims of sequential topics were ~40 ms each.
-- And vacuum this queue table early: every finished event leaves dead
-- entries in the partial indexes that head checks must step over until
-- vacuum removes them (the usual advice for job tables).

    CREATE INDEX events_running_keys ON mailroom.events (topic, key) WHERE status = 'running';
    ALTER TABLE mailroom.events SET (
        autovacuum_vacuum_scale_factor = 0.01,
        autovacuum_vacuum_threshold = 1000,
        autovacuum_vacuum_cost_delay = 0
    );

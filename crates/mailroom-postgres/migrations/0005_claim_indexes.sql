-- Claims that only `events_claim` can serve, and one index entry
-- less per claim of a keyless event.
-- - `events_topic_seq (topic, seq)` could serve claims as well as
-- `events_claim` does: with statistics taken while every row was
-- pending the two tie, the planner took it, and each claim then
-- stepped over every finished row of the topic. Listings by topic now
-- read pending events from `events_claim` and the others from
-- `events_listing`, which a claim (`status = 'pending'`) cannot use.
-- - `events_running_keys` only serves keyed events (its lookups compare
-- `key`), but took an entry for every keyless claim too.

    DROP INDEX mailroom.events_topic_seq;
    CREATE INDEX events_listing ON mailroom.events (topic, seq) WHERE status <> 'pending';
    DROP INDEX mailroom.events_running_keys;
    CREATE INDEX events_running_keys ON mailroom.events (topic, key)
        WHERE status = 'running' AND key IS NOT NULL;

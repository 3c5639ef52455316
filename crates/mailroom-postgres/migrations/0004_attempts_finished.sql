-- The attempts of the last minutes, for the failure_rate and
-- processing_time alerts. History rows are appended in finished_at
-- order, which a BRIN index summarises for almost nothing per insert.

    CREATE INDEX attempts_finished ON mailroom.attempts USING brin (finished_at);

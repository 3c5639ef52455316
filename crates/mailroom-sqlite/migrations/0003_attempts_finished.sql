-- The attempts of the last minutes, for the failure_rate and
-- processing_time alerts (finished_at only grows: appends at the end).

    CREATE INDEX attempts_finished ON attempts (finished_at);

-- The statuses `cancelled` (withdrawn by an operator) and
-- `expired` (older than the topic's expire_after): final like dead.

    ALTER TABLE mailroom.events DROP CONSTRAINT events_status_check;
    ALTER TABLE mailroom.events ADD CONSTRAINT events_status_check CHECK
        (status IN ('pending', 'running', 'done', 'dead', 'skipped', 'cancelled', 'expired'));

-- `queue_keys` leaves out running rows. A claim (pending to
-- running) then adds no entry to it, and a completion (which deletes a
-- running row) leaves no dead entry in it: the head probes of
-- sequential claims step over one dead entry per finished event of
-- their key instead of two. A running event of the key is found by
-- `queue_running`, which every head test probes anyway
-- (docs/src/design/sequential.md).

    DROP INDEX mailroom.queue_keys;
    CREATE INDEX queue_keys ON mailroom.queue (topic, key, seq)
        WHERE key IS NOT NULL AND state <> 'running';

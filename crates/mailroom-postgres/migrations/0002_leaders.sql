-- Leases for electing the one instance that runs maintenance.

    CREATE TABLE mailroom.leaders (
        role        text        PRIMARY KEY,              -- e.g. 'maintenance'
        holder      text        NOT NULL,                 -- the instance's worker name
        lease_until timestamptz NOT NULL
    );

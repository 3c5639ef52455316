-- Each event's payload schema version, as its sender gave it (a source's
-- `version` extractor, else the `mailroom-version` header); NULL is
-- version "1". Older builds never name the column: their inserts leave
-- it NULL and their reads skip it, so builds of 8 and 9 still run.

    ALTER TABLE events ADD COLUMN version TEXT;

-- Each event's payload schema version, as its sender gave it (a source's
-- `version` extractor, else the `mailroom-version` header); NULL is
-- version "1". Older builds never name the column: their inserts leave
-- it NULL and their reads skip it, so builds of 15 and 16 still run.
-- (IF NOT EXISTS: the schema tests that write and claim under an older
-- schema with this build's statements add it beforehand.)

    ALTER TABLE mailroom.events ADD COLUMN IF NOT EXISTS version text;

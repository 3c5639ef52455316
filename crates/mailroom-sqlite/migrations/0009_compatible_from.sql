-- Each recorded version says which older builds still run against
-- the schema it made (`compatible_from`; NULL: only builds that know
-- it), so a build that meets a newer schema than its own knows whether
-- to run or to refuse (`SchemaVersion`).

    ALTER TABLE schema_migrations ADD COLUMN compatible_from INTEGER;

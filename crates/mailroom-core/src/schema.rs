//! Schema versions: where a store's database stands against the migrations
//! a build carries, and whether that build may run against it
//! (docs/src/guides/operations.md, "Migrations and least privilege").
//!
//! Each backend numbers its migrations 1, 2, ... and records the ones
//! applied in the database. A build runs against its own version; against
//! an older one only after the missing migrations are applied
//! ([`Store::migrate`](crate::Store::migrate), `mailroom migrate`); against
//! a newer one only when the database says so: each applied migration
//! records the oldest build version that still runs against the schema it
//! made (`compatible_from`), which is lower than its own version only for
//! additive migrations that older builds do not notice.

use crate::StoreError;

/// A database's schema against the migrations this build carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemaVersion {
    /// The newest migration recorded in the database; 0 before the first
    /// (no schema at all).
    pub database: u32,
    /// The oldest build version that runs against the database's schema:
    /// `database`, unless its newest migration was marked compatible with
    /// builds that do not know it.
    pub compatible_from: u32,
    /// The newest migration this build carries.
    pub build: u32,
}

/// How a build and a database's schema fit ([`SchemaVersion::fit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaFit {
    /// The database is at this build's version.
    Current,
    /// The database is older (or empty): its missing migrations must be
    /// applied before this build runs against it.
    Behind,
    /// The database is newer, and its newer migrations were marked
    /// compatible with this build: it runs (a rolling upgrade in progress).
    NewerCompatible,
    /// The database is newer and needs a newer build.
    TooNew,
}

impl SchemaVersion {
    /// Where this build stands with the database.
    pub fn fit(&self) -> SchemaFit {
        use std::cmp::Ordering::{Equal, Greater, Less};
        match self.database.cmp(&self.build) {
            Equal => SchemaFit::Current,
            Less => SchemaFit::Behind,
            Greater if self.compatible_from <= self.build => SchemaFit::NewerCompatible,
            Greater => SchemaFit::TooNew,
        }
    }

    /// `Ok` when this build may run against the database as it is (current,
    /// or newer and compatible); otherwise [`StoreError::Schema`], whose
    /// message names both versions and what to do.
    pub fn require_runnable(&self) -> Result<(), StoreError> {
        match self.fit() {
            SchemaFit::Current | SchemaFit::NewerCompatible => Ok(()),
            SchemaFit::Behind | SchemaFit::TooNew => Err(StoreError::Schema(*self)),
        }
    }

    /// Why this build refuses the database, or what it notes about it.
    pub fn explain(&self) -> String {
        let Self {
            database,
            compatible_from,
            build,
        } = *self;
        match self.fit() {
            SchemaFit::Current => format!("the schema is at version {database}, this build's"),
            SchemaFit::Behind if database == 0 => format!(
                "the database has no mailroom schema yet (this build needs schema version \
                 {build}): run `mailroom migrate` as a role that may create it"
            ),
            SchemaFit::Behind => format!(
                "the database's schema is at version {database}, older than this build's \
                 version {build}: run `mailroom migrate` (as the role that owns the schema) \
                 before starting this build"
            ),
            SchemaFit::NewerCompatible => format!(
                "the database's schema is at version {database}, newer than this build's \
                 version {build}, and compatible with builds from version {compatible_from}: \
                 this build runs against it; upgrade it when you can"
            ),
            SchemaFit::TooNew => format!(
                "the database's schema is at version {database}, newer than this build's \
                 version {build}, and needs a build of schema version {compatible_from} or \
                 newer: upgrade this mailroom binary"
            ),
        }
    }
}

/// What [`Store::migrate`](crate::Store::migrate) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migrated {
    /// The database's version before (0: there was no schema).
    pub from: u32,
    /// Where the schema stands now.
    pub schema: SchemaVersion,
}

impl Migrated {
    /// Whether migrations were applied (otherwise it was up to date, or newer).
    pub fn applied(&self) -> bool {
        self.schema.database > self.from
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn v(database: u32, compatible_from: u32, build: u32) -> SchemaVersion {
        SchemaVersion {
            database,
            compatible_from,
            build,
        }
    }

    /// A build runs against its own schema and against a newer one whose
    /// migrations were marked compatible with it; it refuses an older or
    /// empty schema and a newer incompatible one, naming both versions.
    #[test]
    fn a_build_runs_only_against_schemas_it_can_use() {
        assert_eq!(v(15, 15, 15).fit(), SchemaFit::Current);
        assert_eq!(v(14, 14, 15).fit(), SchemaFit::Behind);
        assert_eq!(v(0, 0, 15).fit(), SchemaFit::Behind);
        assert_eq!(v(17, 15, 15).fit(), SchemaFit::NewerCompatible);
        assert_eq!(v(17, 14, 15).fit(), SchemaFit::NewerCompatible);
        assert_eq!(v(17, 16, 15).fit(), SchemaFit::TooNew);
        assert!(v(15, 15, 15).require_runnable().is_ok());
        assert!(v(17, 15, 15).require_runnable().is_ok());

        let older = v(14, 14, 15).require_runnable().unwrap_err().to_string();
        assert!(older.contains("mailroom migrate"), "{older}");
        assert!(
            older.contains("version 14") && older.contains("version 15"),
            "{older}"
        );
        let empty = v(0, 0, 15).require_runnable().unwrap_err().to_string();
        assert!(empty.contains("no mailroom schema") && empty.contains("mailroom migrate"));
        let newer = v(17, 16, 15).require_runnable().unwrap_err().to_string();
        assert!(
            newer.contains("version 17") && newer.contains("version 15"),
            "{newer}"
        );
        assert!(
            newer.contains("version 16") && newer.contains("upgrade"),
            "{newer}"
        );
    }
}

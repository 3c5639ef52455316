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

impl SchemaVersion {
    /// A database without the table of recorded migrations: version 0.
    pub fn empty(build: u32) -> Self {
        Self {
            database: 0,
            compatible_from: 0,
            build,
        }
    }

    /// The schema's version from the newest recorded migration, `(version,
    /// compatible_from)` as the database stores them (no row: version 0;
    /// no `compatible_from`: only builds that know the version run).
    pub fn recorded(newest: Option<(i64, Option<i64>)>, build: u32) -> Result<Self, StoreError> {
        let (database, floor) = newest.unwrap_or((0, None));
        let database = u32::try_from(database)
            .map_err(|_| StoreError::Corrupt(format!("schema version {database} out of range")))?;
        let compatible_from = floor
            .and_then(|f| u32::try_from(f).ok())
            .map_or(database, |f| f.min(database));
        Ok(Self {
            database,
            compatible_from,
            build,
        })
    }

    /// What a migration run answers without applying anything: `None` when
    /// the database is behind this build (migrations to apply), otherwise
    /// [`Migrated`] at this version when this build runs against it, or
    /// [`StoreError::Schema`] for a newer schema it cannot use.
    pub fn nothing_to_apply(&self) -> Result<Option<Migrated>, StoreError> {
        if self.database < self.build {
            return Ok(None);
        }
        self.require_runnable()?;
        Ok(Some(Migrated {
            from: self.database,
            schema: *self,
        }))
    }
}

/// A backend's migrations as a runner applies them: how many this build
/// carries, and which of them older builds still run against.
#[derive(Debug, Clone, Copy)]
pub struct Migrations {
    /// Migrations this build carries, numbered 1 to `count`.
    pub count: usize,
    /// The migration that added `compatible_from` to the table of recorded
    /// migrations: earlier ones cannot record it.
    pub compatible_from_column: usize,
    /// Migrations that builds which do not know them still run against:
    /// the version, and the oldest build version that runs against the
    /// schema it makes (recorded as `compatible_from`). Only migrations
    /// that older builds cannot notice qualify (a new table or index they
    /// do not use, a column with a default that their statements do not
    /// name, a function they do not call); never a dropped or renamed
    /// object, a tightened constraint or a changed function or trigger that
    /// older builds rely on.
    pub compatible: &'static [(usize, u32)],
}

impl Migrations {
    /// Migration `n`'s number as recorded (`n` is at most a few dozen).
    pub fn number(n: usize) -> u32 {
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// This build's schema version: its newest migration.
    pub fn build(&self) -> u32 {
        Self::number(self.count)
    }

    /// The `compatible_from` to record with migration `version`: the
    /// oldest build that runs against the schema it makes, when older than
    /// the migration itself and the column exists.
    pub fn compatible_from(&self, version: usize) -> Option<u32> {
        self.compatible
            .iter()
            .find(|(v, _)| *v == version && version >= self.compatible_from_column)
            .map(|(_, floor)| *floor)
    }

    /// The marks only ever name older builds, on migrations this build
    /// carries that can record them; the first one that does not, as a
    /// sentence.
    pub fn check(&self) -> Result<(), String> {
        for &(version, floor) in self.compatible {
            if version < self.compatible_from_column || version > self.count {
                return Err(format!(
                    "migration {version} is marked compatible but cannot record it                      (migrations {} to {})",
                    self.compatible_from_column, self.count
                ));
            }
            if floor as usize >= version {
                return Err(format!(
                    "migration {version} is marked compatible from {floor}, not an older build"
                ));
            }
        }
        Ok(())
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

    /// A recorded version reads as the database's version, with
    /// `compatible_from` when recorded (never above the version itself);
    /// no row is version 0; a negative number is refused as corrupt.
    #[test]
    fn recorded_versions_read_as_the_database_stores_them() {
        assert_eq!(SchemaVersion::recorded(None, 9).unwrap(), v(0, 0, 9));
        assert_eq!(
            SchemaVersion::recorded(None, 9).unwrap(),
            SchemaVersion::empty(9)
        );
        assert_eq!(
            SchemaVersion::recorded(Some((8, None)), 9).unwrap(),
            v(8, 8, 9)
        );
        assert_eq!(
            SchemaVersion::recorded(Some((11, Some(9))), 9).unwrap(),
            v(11, 9, 9)
        );
        assert_eq!(
            SchemaVersion::recorded(Some((7, Some(12))), 9).unwrap(),
            v(7, 7, 9)
        );
        assert!(matches!(
            SchemaVersion::recorded(Some((-1, None)), 9),
            Err(StoreError::Corrupt(_))
        ));
    }

    /// A migration run applies nothing to a current or newer compatible
    /// schema, refuses a newer incompatible one, and goes on for an older one.
    #[test]
    fn nothing_to_apply_only_when_the_database_is_not_behind() {
        assert_eq!(v(8, 8, 9).nothing_to_apply().unwrap(), None);
        let current = v(9, 9, 9).nothing_to_apply().unwrap().unwrap();
        assert_eq!((current.from, current.applied()), (9, false));
        assert!(v(10, 9, 9).nothing_to_apply().unwrap().is_some());
        assert!(matches!(
            v(10, 10, 9).nothing_to_apply(),
            Err(StoreError::Schema(_))
        ));
    }

    /// Compatibility marks are recorded only from the column's migration
    /// on, and a mark that names a build not older than its migration, or a
    /// migration the build does not carry, is found by `check`.
    #[test]
    fn compatibility_marks_are_recorded_and_checked() {
        let m = Migrations {
            count: 10,
            compatible_from_column: 9,
            compatible: &[(9, 8), (10, 8)],
        };
        assert_eq!(m.check(), Ok(()));
        assert_eq!(m.build(), 10);
        assert_eq!(
            (m.compatible_from(9), m.compatible_from(8)),
            (Some(8), None)
        );
        let early = Migrations {
            compatible: &[(8, 7)],
            ..m
        };
        assert_eq!(early.compatible_from(8), None);
        assert!(early.check().is_err());
        assert!(
            Migrations {
                compatible: &[(10, 10)],
                ..m
            }
            .check()
            .is_err()
        );
        assert!(
            Migrations {
                compatible: &[(11, 8)],
                ..m
            }
            .check()
            .is_err()
        );
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

//! mailroom-sqlite (under construction)

//! mailroom (under construction)

//! mailroom-signatures (under construction)

//! mailroom-server (under construction)

-- The W3C traceparent received with an event, forwarded (as a child)
-- to its handler calls. NULL for events that came without one.

    ALTER TABLE events ADD COLUMN traceparent TEXT;

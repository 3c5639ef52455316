-- The W3C traceparent received with an event, forwarded (as a child)
-- to its handler calls. NULL without one, and for outbox rows
-- (`mailroom.enqueue` does not take one).

    ALTER TABLE mailroom.events ADD COLUMN traceparent text;

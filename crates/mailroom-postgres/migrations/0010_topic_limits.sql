-- Scheduling limits (`rate`, `max_running`), one row per limited
-- or paused topic: the rate budget every instance takes grants from (a token
-- bucket refilled on the database clock, holding at most one grant) and
-- the pause a handler's 429 + Retry-After asked for.

    CREATE TABLE mailroom.topic_limits (
        topic        text             PRIMARY KEY,
        tokens       double precision NOT NULL DEFAULT 0,
        refilled_at  timestamptz      NOT NULL DEFAULT clock_timestamp(),
        paused_until timestamptz
    );

    -- Takes up to `want` whole tokens from the topic's budget after
    -- refilling it by the time since the last take (at `per_second`, capped
    -- at `cap`). The clock is read after the row lock, so a take that
    -- waited for another sees the time it really runs at.
    CREATE FUNCTION mailroom.take_tokens(
        p_topic text, per_second double precision, cap double precision, want integer,
        OUT granted integer, OUT wait_ms bigint
    ) LANGUAGE plpgsql VOLATILE AS $$
    DECLARE
        have double precision;
        since timestamptz;
        t timestamptz;
    BEGIN
        INSERT INTO mailroom.topic_limits (topic, tokens, refilled_at)
        VALUES (p_topic, cap, clock_timestamp())
        ON CONFLICT (topic) DO NOTHING;
        SELECT l.tokens, l.refilled_at INTO have, since
        FROM mailroom.topic_limits l WHERE l.topic = p_topic FOR UPDATE;
        t := clock_timestamp();
        have := LEAST(cap, have + per_second * GREATEST(0, EXTRACT(EPOCH FROM t - since)::double precision));
        granted := GREATEST(0, LEAST(want, floor(have)))::integer;
        UPDATE mailroom.topic_limits
        SET tokens = have - granted, refilled_at = GREATEST(t, since)
        WHERE topic = p_topic;
        wait_ms := CASE WHEN granted > 0 THEN 0
                   ELSE GREATEST(1, ceil((LEAST(want, cap) - have) / per_second * 1000))::bigint END;
    END;
    $$;

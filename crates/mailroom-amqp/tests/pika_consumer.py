"""A consumer in another language: reads what mailroom's relay published.

Usage: pika_consumer.py AMQP_URL QUEUE COUNT

Takes COUNT messages from QUEUE with Python's pika (acking each) and prints
one JSON object per message: routing key, properties, mailroom headers and
body. Exits 1 if fewer than COUNT arrive within 10 seconds.
"""
import json
import sys
import time

import pika


def text(value):
    return value.decode("utf-8") if isinstance(value, bytes) else value


def main(url, queue, count):
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    deadline = time.monotonic() + 10
    seen = 0
    while seen < count and time.monotonic() < deadline:
        method, props, body = channel.basic_get(queue, auto_ack=False)
        if method is None:
            time.sleep(0.05)
            continue
        headers = {k: text(v) for k, v in (props.headers or {}).items()}
        print(json.dumps({
            "routing_key": method.routing_key,
            "message_id": props.message_id,
            "type": props.type,
            "correlation_id": props.correlation_id,
            "content_type": props.content_type,
            "delivery_mode": props.delivery_mode,
            "topic": headers.get("mailroom-topic"),
            "body": json.loads(body),
        }), flush=True)
        channel.basic_ack(method.delivery_tag)
        seen += 1
    connection.close()
    if seen < count:
        print(f"only {seen} of {count} messages arrived", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))

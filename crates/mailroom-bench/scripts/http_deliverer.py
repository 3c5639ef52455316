"""A hand-written webhook deliverer, as users write one: poll a SQLite
outbox table, POST each pending row with http.client over keep-alive
connections (one per worker thread), signed per Standard Webhooks, then
mark the batch delivered in one transaction.

Usage: http_deliverer.py DB URL CONCURRENCY SECRET_B64
Prints one JSON line: delivered, failed, seconds, cpu_seconds (this
process's own getrusage).
"""

import base64
import hashlib
import hmac
import http.client
import json
import resource
import sqlite3
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main():
    db_path, url, concurrency, secret = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    key = base64.b64decode(secret)
    target = urllib.parse.urlsplit(url)
    local = threading.local()

    def connection():
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
            local.conn = conn
        return conn

    def deliver(row):
        _, msg_id, topic, payload = row
        ts = str(int(time.time()))
        mac = hmac.new(key, f"{msg_id}.{ts}.".encode() + payload, hashlib.sha256)
        headers = {
            "webhook-id": msg_id,
            "webhook-timestamp": ts,
            "webhook-signature": "v1," + base64.b64encode(mac.digest()).decode(),
            "content-type": "application/json",
            "mailroom-topic": topic,
        }
        for _ in range(2):
            conn = connection()
            try:
                conn.request("POST", target.path or "/", body=payload, headers=headers)
                resp = conn.getresponse()
                resp.read()
                return 200 <= resp.status < 300
            except (http.client.HTTPException, OSError):
                conn.close()
                local.conn = None
        return False

    db = sqlite3.connect(db_path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    delivered = failed = 0
    cpu_before = cpu_seconds()
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        while True:
            rows = db.execute(
                "SELECT id, msg_id, topic, payload FROM outbox WHERE delivered_at IS NULL "
                "ORDER BY id LIMIT 100"
            ).fetchall()
            if not rows:
                break
            results = list(pool.map(deliver, rows))
            done = [(row[0],) for row, ok in zip(rows, results) if ok]
            with db:
                db.executemany(
                    "UPDATE outbox SET delivered_at = strftime('%s', 'now') WHERE id = ?", done
                )
            delivered += len(done)
            failed += len(rows) - len(done)
            if not done:
                break
    seconds = time.monotonic() - started
    print(json.dumps({
        "delivered": delivered,
        "failed": failed,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds() - cpu_before,
    }))


if __name__ == "__main__":
    main()

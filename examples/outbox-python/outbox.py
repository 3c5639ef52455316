"""The outbox from Python: an event enqueued in the same PostgreSQL
transaction as the business write it announces.

    DATABASE_URL=postgres://app@127.0.0.1:5432/app python3 outbox.py

needs psycopg 3 (pip install "psycopg[binary]", or Debian's python3-psycopg)
and a database where `mailroom migrate` has run. A `mailroom serve` on the
same database relays the event to the topic's handler once the transaction
commits; a rolled-back transaction leaves nothing.
"""

import json
import os
import sys

import psycopg

DSN = os.environ["DATABASE_URL"]


def debit(conn, account, amount, operation):
    """Debit an account and announce it, atomically: both or neither."""
    with conn.transaction():
        conn.execute(
            "UPDATE accounts SET balance = balance - %s WHERE id = %s",
            (amount, account),
        )
        (event_id,) = conn.execute(
            "SELECT mailroom.enqueue(%s, %s, %s, %s::jsonb, %s)",
            (
                "payments",                       # topic
                "payment.debited",                # type
                f"account-{account}",             # key: order per account
                json.dumps({"account": account, "amount": amount}),
                f"debit-{account}-{operation}",   # dedup key: stored once
            ),
        ).fetchone()
        return event_id


def main():
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS accounts (id int PRIMARY KEY, balance int NOT NULL)"
        )
        conn.execute(
            "INSERT INTO accounts VALUES (7, 100) ON CONFLICT (id) DO NOTHING"
        )

        event_id = debit(conn, 7, 10, "0042")
        print("enqueued", event_id)

        # A failed business transaction enqueues nothing.
        try:
            with conn.transaction():
                conn.execute(
                    "SELECT mailroom.enqueue('payments', 'payment.debited', 'account-7', "
                    "'{\"account\": 7, \"amount\": 1000}'::jsonb, 'debit-7-0043')"
                )
                raise RuntimeError("insufficient funds")
        except RuntimeError as err:
            print("rolled back:", err)


if __name__ == "__main__":
    sys.exit(main())

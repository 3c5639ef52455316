# worker.py — a complete pull worker for the topic "thumbnails"
# (python3 worker.py; MAILROOM_URL defaults to http://127.0.0.1:8080).
import json, os, time, urllib.request

BASE = os.environ.get("MAILROOM_URL", "http://127.0.0.1:8080")

def call(path, body):
    req = urllib.request.Request(BASE + path, json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    with urllib.request.urlopen(req) as resp:
        return json.load(resp)

while True:
    events = call("/v1/topics/thumbnails/claim", {"max": 10, "lease": "60s"})["events"]
    if not events:
        time.sleep(1)
        continue
    for e in events:
        try:
            print("processing", e["id"], e["payload"], flush=True)   # your work here
            call(f"/v1/events/{e['id']}/ack", {"token": e["token"]})
        except Exception as err:
            call(f"/v1/events/{e['id']}/nack", {"token": e["token"], "error": str(err)})
